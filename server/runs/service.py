"""Run lifecycle as the API sees it: create (frozen config), list, inspect, stop, logs."""

from __future__ import annotations

import builtins
import json
import secrets
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlmodel import SQLModel, col, select

from core import lifecycle, rollout_store
from core.checkpoint_check import STATE_KIND
from core.db import read_session, write_session
from core.models import FINISHED, RUN_ID, TINKER_API, Checkpoint, Metric, Run, RunStatus
from core.run_folder import RunFolder, hash_config, log_lines
from core.settings import Settings
from core.spec import ResumePoint, RunSpec
from server.environments.catalog import EnvEntry
from server.environments.configs import ConfigService, Resolved
from server.errors import Conflict, InvalidValue, NotFound
from server.launch.launchers import Launchers
from server.runs.checkpoint_pick import at_step, newest_loadable
from server.runs.metrics import MetricsService
from server.runs.references import References
from server.runs.schemas import (
    CheckpointOut,
    RunCreatedOut,
    RunDetailOut,
    RunHistoryOut,
    RunLogsOut,
    RunResultsOut,
    RunResumedOut,
    RunSummaryOut,
)
from server.runs.views import RunViews


@dataclass(frozen=True)
class FrozenConfig:
    """A run's config as frozen into its folder and row: the values, their hash, its steps."""

    values: dict[str, Any]
    hash: str
    total_steps: int


@dataclass
class PlannedRun:
    """A validated run not yet written: its row and frozen spec (ids given at launch)."""

    run: Run
    spec: RunSpec


SUMMARY_COLUMNS = (
    "id",
    "environment",
    "status",
    "step",
    "total_steps",
    "attempt",
    "failure_kind",
    "created_at",
    "started_at",
    "finished_at",
    "last_step_at",
    "config_json",  # for the model's name
    "sweep_id",
    "parent_run_id",
    "parent_step",
    "source",
    # What it spent (core/cost.py): a list reads the totals, never the metric rows.
    "cost_device",
    "cost_device_s",
    "cost_cpu_s",
    "cost_tokens_prefill",
    "cost_tokens_sampled",
    "cost_tokens_trained",
)


class RunService:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        configs: ConfigService,
        metrics: MetricsService,
        launchers: Launchers,
        wake_supervisor: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._configs = configs
        self._metrics = metrics
        self._views = RunViews(settings, metrics)
        self._references = References(engine, configs)
        self._launchers = launchers
        self._wake = wake_supervisor

    # Creating ----------------------------------------------------------------------------

    def create(
        self,
        environment: str | None,
        overrides: dict[str, Any],
        idempotency_key: str | None = None,
    ) -> RunCreatedOut:
        """Resolve and freeze the config, write the run folder and row, queue it."""
        if idempotency_key is not None:
            existing = self._by_idempotency_key(idempotency_key)
            if existing is not None:
                return RunCreatedOut(run_id=existing.id, status=existing.status.value)
        name = environment or self._configs.selected()
        entry, config = self._configs.resolve(name, overrides)
        self._configs.check_model(config)
        planned = self.plan(entry, config)
        planned.run.idempotency_key = idempotency_key
        try:
            (run_id,) = self.launch([planned])
        except (IntegrityError, OperationalError) as exc:
            # A repeated Idempotency-Key lost the race to the first request: answer with its run.
            existing = None
            if isinstance(exc, IntegrityError) and idempotency_key is not None:
                existing = self._by_idempotency_key(idempotency_key)
            if existing is None:
                raise
            return RunCreatedOut(run_id=existing.id, status=existing.status.value)
        return RunCreatedOut(run_id=run_id, status=RunStatus.queued.value)

    def plan(self, entry: EnvEntry, config: Resolved, **row: Any) -> PlannedRun:
        """A run's row and frozen spec for a validated config (`row`: extra Run fields);
        nothing is written until `launch`. Run references (kl_reference, teacher) are
        checked and pinned to their step."""
        self._configs.check_starts(entry.name, config)
        config = config.model_copy(update=self._references.pins(config.model_dump(mode="json")))
        values = config.model_dump(mode="json")
        config_hash = hash_config(values)
        assert entry.class_name is not None  # resolve() imported it
        spec = RunSpec(
            run_id="",  # named in launch(), where its folder is made
            environment=entry.name,
            env_file=str(entry.path),
            env_class=entry.class_name,
            config_hash=config_hash,
            config=values,
            mix=self._configs.mix(entry.name, config) if config.environments else None,
            framework=entry.framework,
        )
        run = Run(
            id="",
            environment=entry.name,
            status=RunStatus.queued,
            config_json=json.dumps(values, sort_keys=True),
            config_hash=config_hash,
            total_steps=config.total_steps,
            run_dir="",
            **row,
        )
        return PlannedRun(run, spec)

    def launch(
        self, planned: list[PlannedRun], also: Callable[[], Sequence[SQLModel]] = tuple
    ) -> list[str]:
        """Write each run's folder and frozen spec, then every row (and the rows `also` makes
        once the runs have their ids) in one transaction, and wake the supervisor. All or
        nothing: on a failure no folder is left behind. The new runs' ids, in order."""
        made: list[Path] = []
        ids: list[str] = []
        try:
            for item in planned:
                run_id = self._new_id()
                run_dir = self._settings.runs_dir / run_id
                # The folder and its frozen spec exist before the row, and the row before any
                # process.
                RunFolder(run_dir).create(item.spec.model_copy(update={"run_id": run_id}))
                made.append(run_dir)
                item.run.id, item.run.run_dir = run_id, str(run_dir)
                ids.append(run_id)
            with write_session(self._engine) as session:
                for row in also():
                    session.add(row)
                for item in planned:
                    session.add(item.run)
        except BaseException:
            for run_dir in made:
                shutil.rmtree(run_dir, ignore_errors=True)  # no row, so no folder either
            raise
        self._wake()
        return ids

    @property
    def engine(self) -> Engine:
        return self._engine

    def _by_idempotency_key(self, key: str) -> Run | None:
        with read_session(self._engine) as session:
            return session.exec(select(Run).where(Run.idempotency_key == key)).first()

    def _new_id(self) -> str:
        while True:
            run_id = f"r-{secrets.token_hex(4)}"
            if not (self._settings.runs_dir / run_id).exists():
                return run_id

    # Reading -----------------------------------------------------------------------------

    def get(self, run_id: str) -> RunDetailOut:
        run = self.row(run_id)
        return self._views.detail(run, self._queue_position(run))

    def list(
        self,
        status: RunStatus | None = None,
        environment: str | None = None,
        limit: int = 100,
        offset: int = 0,
        source: str | None = None,
    ) -> list[RunSummaryOut]:
        # Only the summary's columns: building whole rows (frozen config JSON) costs more.
        query = select(*(getattr(Run, name) for name in SUMMARY_COLUMNS))
        if status is not None:
            query = query.where(Run.status == status)
        if source is not None:
            query = query.where(Run.source == source)
        if environment is not None:
            query = query.where(Run.environment == environment)
        query = query.order_by(col(Run.created_at).desc(), col(Run.id).desc())
        with read_session(self._engine) as session:
            rows = session.exec(query.offset(offset).limit(limit)).all()
        rewards = self._metrics.latest_rewards([row.id for row in rows])
        return [self._views.summary(row, rewards.get(row.id)) for row in rows]

    def row(self, run_id: str) -> Run:
        check_run_id(run_id)
        with read_session(self._engine) as session:
            run = session.get(Run, run_id)
        if run is None:
            raise no_such_run(run_id)
        return run

    def count_active(self) -> int:
        with read_session(self._engine) as session:
            return lifecycle.count_active(session)

    def _queue_position(self, run: Run) -> tuple[int, int] | None:
        """Place in the queue and runs holding slots, for a run waiting for a slot; None for
        any other (a Ray job waiting for the cluster says why in its details)."""
        if run.status != RunStatus.queued or run.job_id is not None or run.details:
            return None
        with read_session(self._engine) as session:
            ahead = session.exec(
                select(func.count())
                .select_from(Run)
                .where(
                    Run.status == RunStatus.queued,
                    col(Run.job_id).is_(None),
                    col(Run.created_at) < run.created_at,
                )
            ).one()
            active = lifecycle.count_active(session)
        return ahead + 1, active

    # Results ----------------------------------------------------------------------------

    def results(self, run_id: str, history_rows: int = 20) -> RunResultsOut:
        """Final (or latest) metrics, recent history, checkpoints and where the weights are."""
        run = self.row(run_id)
        metrics = self._metrics
        latest = metrics.latest(run)
        return RunResultsOut(
            run_id=run.id,
            environment=run.environment,
            status=run.status.value,
            step=run.step,
            total_steps=run.total_steps,
            final=RunStatus(run.status) in FINISHED,
            metrics=latest.metrics,
            metrics_source=latest.source,
            metrics_note=latest.note,
            latest=metrics.latest_values(run.id),
            history=metrics.history(run.id, limit=history_rows),
            wandb_url=run.wandb_url,
            weights_path=run.weights_path,
            checkpoints=metrics.checkpoints(run.id),
        )

    def history(
        self, run_id: str, keys: str | None, limit: int, max_points: int | None = None
    ) -> RunHistoryOut:
        """Metric rows for plots; `keys` is a comma-separated list (all keys when absent)."""
        run = self.row(run_id)
        wanted = [k.strip() for k in keys.split(",") if k.strip()] if keys else None
        rows = self._metrics.history(run.id, wanted, limit, max_points)
        return RunHistoryOut(run_id=run.id, keys=wanted, rows=rows)

    def checkpoints(self, run_id: str) -> builtins.list[CheckpointOut]:
        return self._metrics.checkpoints(self.row(run_id).id)

    @staticmethod
    def spec(run: Run) -> RunSpec:
        """What the server froze into the run's folder: environment(s), config and hash."""
        return RunFolder(run.run_dir).spec()

    # Stopping ----------------------------------------------------------------------------

    def stop(self, run_id: str) -> RunCreatedOut:
        """Ask a run to stop: cancel it if queued, else pass the request to its launcher (a local
        run gets SIGTERM at once); idempotent."""
        check_run_id(run_id)
        with write_session(self._engine) as session:
            run = session.get(Run, run_id)
            if run is None:
                raise no_such_run(run_id)
            status = RunStatus(run.status)
            if status in FINISHED or status == RunStatus.stopping:
                return RunCreatedOut(run_id=run_id, status=status.value)
            if status == RunStatus.queued and run.job_id is None:
                lifecycle.transition(
                    session, run, RunStatus.stopped, details="cancelled before it started"
                )
                return RunCreatedOut(run_id=run_id, status=RunStatus.stopped.value)
            lifecycle.transition(session, run, RunStatus.stopping)
            stopping = Run(**run.model_dump())  # the row as committed, usable after the session
        self._launchers.of(stopping).request_stop(stopping)
        self._wake()
        return RunCreatedOut(run_id=run_id, status=RunStatus.stopping.value)

    # Resuming ---------------------------------------------------------------------------

    def resume(
        self,
        run_id: str,
        overrides: dict[str, Any],
        force: bool,
        checkpoint_step: int | None = None,
    ) -> RunResumedOut:
        """A new attempt of a finished run from a state checkpoint (the last one by default),
        continuing its step count.

        The frozen config carries over; overrides (say a larger total_steps) change its hash,
        which is refused unless `force`, since the checkpoint was trained under the old one.
        """
        run = self.row(run_id)
        refuse_session(run, "resumed")
        status = RunStatus(run.status)
        if status not in FINISHED:
            raise Conflict(
                f"Run {run_id} is {status.value}; only a finished run can be resumed "
                f"(stop it first with POST /runs/{run_id}/stop)."
            )
        checkpoint = self.state_checkpoint(run_id, checkpoint_step)
        spec = self.spec(run)
        config = self._refrozen(run, spec, overrides, force)
        folder = RunFolder(run.run_dir)
        folder.write_spec(spec.with_config(config.values, config.hash))
        folder.write_resume(ResumePoint(state_path=checkpoint.path, step=checkpoint.step))
        attempt = self._reopen(run_id, checkpoint.step, config)
        self._wake()
        return RunResumedOut(
            run_id=run_id,
            status=RunStatus.queued.value,
            attempt=attempt,
            resume_step=checkpoint.step,
            resume_from=checkpoint.path,
        )

    def _refrozen(
        self, run: Run, spec: RunSpec, overrides: dict[str, Any], force: bool
    ) -> FrozenConfig:
        """The run's frozen config with `overrides`, revalidated and its run references pinned;
        a 409 naming the fields that change when its hash does and not `force`."""
        _, config = self._configs.revalidate(run.environment, spec.config, overrides)
        config = config.model_copy(update=self._references.pins(config.model_dump(mode="json")))
        # A field added since the run was frozen, left unset, is no change to its config.
        values = {
            k: v
            for k, v in config.model_dump(mode="json").items()
            if k in spec.config or v is not None
        }
        new_hash = hash_config(values)
        if new_hash != run.config_hash and not force:
            changed = sorted(k for k in values if values[k] != spec.config.get(k))
            raise Conflict(
                f"The config would change ({', '.join(changed) or 'environment defaults'}): "
                f"its hash {new_hash} differs from the run's {run.config_hash}. Resume with "
                '"force": true to continue the checkpoint under the new config.',
                changed_fields=changed,
            )
        return FrozenConfig(values=values, hash=new_hash, total_steps=config.total_steps)

    def _reopen(self, run_id: str, step: int, config: FrozenConfig) -> int:
        """Queue the run again from `step` under `config`, dropping what it recorded after that
        step; the new attempt's number."""
        with write_session(self._engine) as session:
            row = session.get(Run, run_id)
            if row is None or not lifecycle.reopen(session, row):
                raise Conflict(f"Run {run_id} changed state meanwhile; try again.")
            row.step = step
            row.total_steps = config.total_steps
            row.config_json = json.dumps(config.values, sort_keys=True)
            row.config_hash = config.hash
            session.add(row)
            # Metrics and rollouts recorded after the checkpoint belong to steps to be redone.
            session.exec(
                delete(Metric).where(col(Metric.run_id) == run_id, col(Metric.step) > step)
            )
            rollout_store.delete_after(session, run_id, step)
            return row.attempt

    def state_checkpoint(
        self, run_id: str, step: int | None, verb: str = "resume from"
    ) -> Checkpoint:
        """The state checkpoint (weights + optimizer) to resume or fork from."""
        return self.checkpoint(run_id, STATE_KIND, step, verb)

    def checkpoint(
        self,
        run_id: str,
        kind: str,
        step: int | None,
        verb: str,
        *,
        verify: bool = True,
    ) -> Checkpoint:
        """A run's checkpoint of `kind` (state or sampler) at `step`, or its newest one that
        may be loaded; a 409/404 saying what exists otherwise (`verb`: what the caller does
        with it, for the messages). `verify=False` skips hashing the files (sampling, where
        the loader checks them itself)."""
        with read_session(self._engine) as session:
            rows = session.exec(
                select(Checkpoint)
                .where(Checkpoint.run_id == run_id, Checkpoint.kind == kind)
                .order_by(col(Checkpoint.step).desc(), col(Checkpoint.id).desc())
            ).all()
        if not rows:
            raise Conflict(
                f"Run {run_id} has no {kind} checkpoint to {verb} (it saves one every save_every "
                "steps and when it stops or ends); wait for one, or use another run."
            )
        if step is None:
            return newest_loadable(run_id, rows, kind, verb) if verify else rows[0]
        return at_step(run_id, rows, kind, step, verb, verify=verify)

    # Logs --------------------------------------------------------------------------------

    def log_path(self, run_id: str) -> Path:
        return RunFolder(self.row(run_id).run_dir).log

    def logs(self, run_id: str, tail: int) -> RunLogsOut:
        run = self.row(run_id)
        text = self.job_log(run)
        if text is not None:
            lines = log_lines(text)[-tail:] if tail > 0 else []
        else:
            lines = RunFolder(run.run_dir).log_tail(tail)
        return RunLogsOut(run_id=run_id, status=run.status.value, lines=lines)

    def job_log(self, run: Run) -> str | None:
        """The attempt's whole log where its launcher keeps it (a Ray job's); None: the run
        folder's train.log is the log."""
        return self._launchers.of(run).log_text(run)


def refuse_session(run: Run, verb: str) -> None:
    """A Tinker SDK session's training is its script's: the server has no loop to run it."""
    if run.source == TINKER_API:
        raise Conflict(
            f"Run {run.id} is a Tinker SDK session: it cannot be {verb} by the server, which "
            "has no training loop of its own for it. Continue from a script instead: "
            "ServiceClient().create_training_client_from_state_with_optimizer(<a tinker:// "
            f"state path of it, GET /runs/{run.id}/checkpoints>)."
        )


def no_such_run(run_id: str) -> NotFound:
    return NotFound(f"No run '{run_id}'. GET /runs lists the runs.")


def check_run_id(run_id: str) -> None:
    if not RUN_ID.match(run_id):
        raise InvalidValue(
            f"run_id: '{run_id[:40]}' is not a run id; run ids look like r-3f9c2a1b "
            "(GET /runs lists them)."
        )
