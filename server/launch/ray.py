"""The `ray` launcher (RLCS_LAUNCHER=ray): a queued run becomes a Ray job whose submission id
is the run's (a retried submit never makes a second job), its spec travelling in the job's
environment; the supervisor reads each job's state every tick to say why it waits, to stop it
after the grace period and to record an end its runner could not (DESIGN §4, §12)."""

from __future__ import annotations

import json
import logging
import shlex
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Engine

from core import lifecycle
from core.db import write_session
from core.models import RAY_LAUNCHER, Run, RunStatus, utcnow
from core.run_folder import RunFolder
from core.settings import Settings
from server.launch import exit_cause
from server.launch.launcher import LauncherHealth, runner_argv
from server.launch.ray_jobs import FINAL_STATES, JobState, RayJobs, RayUnreachable, Resources
from server.launch.settle import Ending, settle

log = logging.getLogger(__name__)
LOG_TAIL_LINES = 20


def job_id_for(run: Run) -> str:
    """The run id for its first attempt; a resumed run's later attempts are new jobs."""
    return run.id if run.attempt <= 1 else f"{run.id}-{run.attempt}"


def resources_for(config: dict[str, Any], settings: Settings) -> Resources:
    """What the job asks of the cluster: the config's num_gpus/num_cpus, else 1 GPU for a
    local run that holds its own model on CUDA (engine private), none for a run on its node's
    engine hosts (they own the node's GPUs: docs/scale-out.md) or on Tinker (its GPUs are
    remote), and 1 CPU."""
    num_gpus = config.get("num_gpus")
    if num_gpus is None:
        backend = config.get("backend", "auto")
        if backend == "auto":
            backend = settings.default_backend
        engine = config.get("engine", "auto")
        if engine == "auto":
            engine = settings.run_engine
        own_gpu = backend == "local" and engine == "private" and settings.device == "cuda"
        num_gpus = 1 if own_gpu else 0
    num_cpus = config.get("num_cpus")
    return Resources(num_cpus=1.0 if num_cpus is None else float(num_cpus), num_gpus=num_gpus)


class RayLauncher:
    kind = RAY_LAUNCHER

    def __init__(self, settings: Settings, engine: Engine, jobs: RayJobs | None = None) -> None:
        self._settings = settings
        self._engine = engine
        self.jobs = jobs or RayJobs(settings)
        self._stop_sent: set[str] = set()

    def health(self) -> LauncherHealth:
        reachable = self.jobs.reachable()
        return LauncherHealth(
            kind=self.kind,
            address=self.jobs.address,
            reachable=reachable,
            reason=None if reachable else self.jobs.last_error,
        )

    # Starting ------------------------------------------------------------------------------

    def start(self, run: Run) -> bool:
        """Submit a queued run as a Ray job; False when Ray cannot be reached (the run stays
        queued, saying so, and no later run is tried this tick)."""
        job_id = job_id_for(run)
        folder = RunFolder(run.run_dir)
        spec = folder.spec()
        resume = folder.resume_point()
        env = self._settings.runner_variables(
            run_spec=spec.model_dump_json(exclude_none=True),
            resume_point=resume.model_dump_json() if resume is not None else None,
        )
        entrypoint = shlex.join(runner_argv(self._settings, run.run_dir))
        # The job's stored metadata names the run, never a key: keys travel in env_vars only.
        metadata = {"rlcs_run_id": run.id, "environment": run.environment}
        try:
            self.jobs.submit(
                job_id, entrypoint, env, resources_for(spec.config, self._settings), metadata
            )
        except RayUnreachable as exc:
            self._note_waiting(run.id, f"waiting for the Ray cluster (RLCS_RAY_ADDRESS): {exc}")
            return False
        except (RuntimeError, ValueError) as exc:  # Ray refused the job itself
            lifecycle.set_status(
                self._engine,
                run.id,
                RunStatus.failed,
                failure_kind="launcher",
                details=f"Ray refused the job: {exc}"[:4000],
            )
            return True
        self._record_submitted(run.id, job_id)
        log.info("submitted run %s as Ray job %s", run.id, job_id)
        return True

    def _record_submitted(self, run_id: str, job_id: str) -> None:
        """Name the job on the queued run; a run cancelled while it was submitted has its job
        stopped instead."""
        with write_session(self._engine) as session:
            row = session.get(Run, run_id)
            submitted = row is not None and row.status == RunStatus.queued
            if submitted:
                assert row is not None
                lifecycle.transition(
                    session,
                    row,
                    RunStatus.queued,
                    launcher=RAY_LAUNCHER,
                    job_id=job_id,
                    details=f"submitted to Ray as job {job_id}; waiting for it to start",
                )
        if not submitted:  # cancelled while being submitted
            self.jobs.stop(job_id)

    def _note_waiting(self, run_id: str, why: str) -> None:
        with write_session(self._engine) as session:
            row = session.get(Run, run_id)
            if row is not None and row.status == RunStatus.queued and row.details != why:
                lifecycle.transition(session, row, RunStatus.queued, details=why)

    # Watching ------------------------------------------------------------------------------

    def reconcile(self, runs: list[Run]) -> None:
        """They went on in Ray meanwhile: read each job's state (ended ones are recorded)."""
        if runs:
            log.info("following %s unfinished Ray job(s)", len(runs))
        self.watch(runs)

    def request_stop(self, run: Run) -> None:
        """Nothing now: the runner, on its own node, reads the request from the database; the
        job is stopped by Ray when the grace period passes (see `watch`)."""

    def log_text(self, run: Run) -> str | None:
        """The job's whole log as Ray keeps it (its runner writes no train.log); None when
        Ray cannot be asked (then the run folder's log is what there is)."""
        if run.job_id is None:
            return None
        try:
            return self.jobs.logs(run.job_id)
        except (RayUnreachable, RuntimeError):
            return None

    def hand_over(self) -> None:
        self._stop_sent.clear()

    def watch(self, runs: list[Run]) -> None:
        """One look at each unfinished Ray run's job; nothing is decided while Ray is away."""
        capacity: dict[str, tuple[float, float]] | None = None
        for run in runs:
            assert run.job_id is not None
            try:
                state = self.jobs.state(run.job_id)
                if state is None:
                    self._settle(run, None)
                elif state.status in FINAL_STATES:
                    self._settle(run, state)
                elif state.status == "PENDING" and run.status == RunStatus.queued:
                    if capacity is None:
                        capacity = self.jobs.capacity()
                    self._note_waiting(run.id, self._pending_reason(run, state, capacity))
                elif run.status == RunStatus.stopping:
                    self._enforce_stop(run, state)
            except RayUnreachable:
                return  # the runs go on in Ray; /health says the launcher is unreachable

    def _pending_reason(
        self, run: Run, state: JobState, capacity: dict[str, tuple[float, float]]
    ) -> str:
        wants = resources_for(json.loads(run.config_json), self._settings)
        why = ""
        gpus_used, gpus_total = capacity.get("GPU", (0.0, 0.0))
        cpus_used, cpus_total = capacity.get("CPU", (0.0, 0.0))
        if capacity and wants.num_gpus > gpus_total:
            why = (
                f"it asks for {wants.num_gpus:g} GPU(s) (num_gpus) and the cluster has "
                f"{gpus_total:g} in all: it waits until a node with enough GPUs joins (or stop "
                "it and start it with a smaller num_gpus). "
            )
        elif capacity and wants.num_gpus > gpus_total - gpus_used:
            why = f"waiting for GPUs: {gpus_used:g} of {gpus_total:g} in use. "
        elif capacity and wants.num_cpus > cpus_total - cpus_used:
            why = f"waiting for CPUs: {cpus_used:g} of {cpus_total:g} in use. "
        return f"Ray job {run.job_id} is PENDING: {why}Ray says: {state.message}"

    def _enforce_stop(self, run: Run, state: JobState) -> None:
        """The runner reads the stop request from the database and ends with a checkpoint; a
        job still running after the grace period is stopped by Ray. A job that never started
        ends the run at once: Ray delivers a stop to a pending job only once it is scheduled
        (never, for one the cluster cannot fit), and no runner would record the end."""
        assert run.job_id is not None
        if state.status == "PENDING":
            self.jobs.stop(run.job_id)
            lifecycle.set_status(
                self._engine,
                run.id,
                RunStatus.stopped,
                details=f"stopped before it started; its Ray job {run.job_id} was PENDING and "
                "is asked to stop (Ray stops it if the cluster ever schedules it)",
            )
            return
        requested = run.stop_requested_at or utcnow()
        overdue = utcnow() - requested > timedelta(seconds=self._settings.stop_grace_s)
        if overdue and run.job_id not in self._stop_sent:
            log.warning(
                "run %s ignored the stop for %ss: stopping its Ray job",
                run.id,
                self._settings.stop_grace_s,
            )
            self.jobs.stop(run.job_id)
            self._stop_sent.add(run.job_id)

    # Settling ends -------------------------------------------------------------------------

    def _settle(self, run: Run, state: JobState | None) -> None:
        """A job that ended (or that Ray no longer has)."""
        job_id = run.job_id
        assert job_id is not None
        self._stop_sent.discard(job_id)
        exit_code = state.exit_code if state is not None else None
        if state is None:
            why = f"Ray has no job {job_id} (was the cluster restarted?)"
        else:
            why = f"its Ray job {job_id} ended {state.status}: {state.message}"
        kind: str | None
        if state is None:
            kind, summary = "lost", f"lost: {why}, and the runner recorded no end"
        elif exit_code is not None and exit_code != 0:
            kind, summary = exit_cause.classify_exit(exit_code, f"exit code {exit_code}", None)
            summary = f"{summary} ({why})"
        elif state.status == "STOPPED":
            kind, summary = None, f"stopped outside this server; {why}"
        else:
            kind = "launcher" if run.started_at is None else "lost"
            summary = f"{why}, and the runner recorded no end"
        ending = Ending(
            exit_code=exit_code,
            stop_details=f"stopped on request; {why}",
            failure_kind=kind,
            summary=summary,
            log_tail=self._log_tail(job_id) if state is not None else [],
            log_name="the job's log",
        )
        # A later attempt (a resume) is a new job: this end is not its end.
        settle(self._engine, run.id, ending, lambda row: row.job_id == job_id)

    def _log_tail(self, job_id: str) -> list[str]:
        try:
            text = self.jobs.logs(job_id)
        except (RayUnreachable, RuntimeError):
            return []
        return text.splitlines()[-LOG_TAIL_LINES:]
