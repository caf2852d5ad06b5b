"""The supervisor: starts queued runs, watches their processes, enforces stop grace, and
after a restart adopts runs that are still alive (DESIGN §1, §4, §10). Runs start through
the configured launcher: local subprocesses (here) or Ray jobs (server.launch.ray);
each run is watched the way its attempt was started, whatever the launcher is now.

It runs as one asyncio task in the server's lifespan; each tick does its blocking work in
a thread. Runs are spawned in their own session so a stop signals the whole process group
and the server dying never kills them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from core import lifecycle, procs
from core.db import read_session, write_session
from core.models import FINISHED, RAY_LAUNCHER, Run, RunStatus, utcnow
from core.run_folder import RunFolder
from core.settings import PROJECT_ROOT, Settings
from server.launch import exit_cause
from server.launch.leadership import Leadership
from server.launch.ray import RayLauncher

log = logging.getLogger(__name__)
LOG_TAIL_LINES = 20


@dataclass
class _Watched:
    pid: int
    start: float | None
    proc: subprocess.Popen[bytes] | None  # None for runs adopted after a restart
    term_sent: bool = False
    # The kernel's oom_kill counters at spawn: a SIGKILL we did not send is an OOM kill when
    # they rose meanwhile.
    oom_before: exit_cause.OomCounters | None = None


class Supervisor:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self._settings = settings
        self._engine = engine
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.leadership = Leadership(engine)
        self._ray: RayLauncher | None = None

    @property
    def ray(self) -> RayLauncher:
        """Made on first use: a server on the local launcher never loads Ray."""
        if self._ray is None:
            self._ray = RayLauncher(self._settings, self._engine)
        return self._ray

    def launcher_health(self) -> dict[str, object]:
        """What /health says of the launcher (for Ray: whether its job server answers)."""
        if self._settings.launcher == RAY_LAUNCHER:
            return self.ray.health()
        return {"kind": "local", "address": None, "reachable": True, "reason": None}

    # Running in the lifespan ---------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        await asyncio.to_thread(self._lead)
        self._task = asyncio.create_task(self._run(), name="rlcs-supervisor")

    def _lead(self) -> bool:
        """Supervise if no other server does (one per database); True while this one does."""
        if self.leadership.held:
            return True
        if not self.leadership.try_acquire():
            return False
        log.info("supervising runs: %s", self.leadership.reason)
        self.reconcile()
        return True

    async def stop(self) -> None:
        """Stop supervising; the runs themselves keep going and are adopted on the next start."""
        self._closing = True
        if self._task is not None:
            self.wake()
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._hand_over()
        self.leadership.release()

    @property
    def role(self) -> str:
        """What /health says: whether this server supervises the runs, and if not why."""
        if self.leadership.held:
            return "supervising"
        return f"standing by: {self.leadership.reason}"

    def _step_down(self) -> None:
        """Another server may supervise now: stop watching (runs go on; it adopts them)."""
        self._hand_over()
        with self._lock:
            self._watched.clear()

    def _hand_over(self) -> None:
        """Runs we started outlive us; while this process lives on (a test, an embedding app),
        each is still reaped when it exits, so none lingers as a zombie."""
        with self._lock:
            children = [w for w in self._watched.values() if w.proc is not None]
            adopted = [w for w in self._watched.values() if w.proc is None]
        for watched in children:
            # One that ended since the last tick: its group is cleared now, as a tick would.
            if self._exited_child(watched) is None:
                assert watched.proc is not None
                _reap_in_background(watched.proc)
        for watched in adopted:  # ended since the last tick: clear what it left behind
            if not procs.same_process_alive(watched.pid, watched.start):
                procs.end_session_leftovers(watched.pid, watched.start)

    def wake(self) -> None:
        """Ask for a tick now (thread-safe); used when a run is queued or stopped."""
        if self._loop is not None and self._event is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    async def _run(self) -> None:
        assert self._event is not None
        standing_by = False
        while not self._closing:
            try:
                leading = await asyncio.to_thread(self._lead)
                if leading and not await asyncio.to_thread(self.leadership.still_held):
                    self._step_down()
                    leading = False
                if leading:
                    await asyncio.to_thread(self.tick)
                    standing_by = False
                elif not standing_by:
                    log.warning("not supervising runs: %s", self.leadership.reason)
                    standing_by = True
            except Exception:  # a bad tick must not end supervision
                log.exception("supervisor tick failed")
            wait = self._settings.supervisor_interval_s
            if standing_by:
                wait = max(wait, self._settings.leader_poll_s)
            try:
                await asyncio.wait_for(self._event.wait(), wait)
            except TimeoutError:
                pass
            self._event.clear()

    # One pass ------------------------------------------------------------------------------

    def tick(self) -> None:
        with self._lock:
            self._watch()
            self._start_queued()

    def reconcile(self) -> None:
        """After a (re)start: adopt unfinished runs whose process lives, settle the others."""
        with self._lock:
            local_runs, ray_runs = self._slot_holders()
            for run in local_runs:
                self._adopt_or_settle(run, "the server restarted and found its process gone")
            if ray_runs:
                # They went on in Ray meanwhile: read each job's state (ended ones are recorded).
                log.info("following %s unfinished Ray job(s)", len(ray_runs))
                self.ray.watch(ray_runs)

    def _adopt_or_settle(self, run: Run, why_lost: str) -> None:
        """Watch a run this server did not start if its process lives; else it is lost."""
        if run.pid is not None and procs.same_process_alive(run.pid, run.process_start):
            self._watched[run.id] = _Watched(run.pid, run.process_start, None)
            log.info("adopted run %s (pid %s)", run.id, run.pid)
        else:
            if run.pid is not None:
                procs.end_session_leftovers(run.pid, run.process_start)
            self._settle_lost(run.id, why_lost)

    def _slot_holders(self) -> tuple[list[Run], list[Run]]:
        """Runs holding a slot: those of local processes, and Ray jobs (watched by their job)."""
        with read_session(self._engine) as session:
            runs = session.exec(select(Run).where(lifecycle.holds_a_slot())).all()
        ray = [run for run in runs if run.launcher == RAY_LAUNCHER]
        return [run for run in runs if run.launcher != RAY_LAUNCHER], ray

    def _watch(self) -> None:
        local_runs, ray_runs = self._slot_holders()
        if ray_runs:
            self.ray.watch(ray_runs)
        active = {run.id: run for run in local_runs}
        for run_id, watched in list(self._watched.items()):
            run = active.get(run_id)
            if watched.proc is not None:
                returncode = self._exited_child(watched)
                if returncode is not None:
                    del self._watched[run_id]
                    self._settle_exit(run_id, returncode, watched)
                    continue
            elif not procs.same_process_alive(watched.pid, watched.start):
                del self._watched[run_id]
                procs.end_session_leftovers(watched.pid, watched.start)
                self._settle_lost(run_id, "its process ended while this server was not its parent")
                continue
            if run is not None and run.status == RunStatus.stopping:
                self._enforce_stop(run, watched)
        # Active in the database but not watched: another server instance's, or lost.
        for run_id, run in active.items():
            if run_id not in self._watched and run.status != RunStatus.starting:
                self._adopt_or_settle(run, "no process is running it")

    def _exited_child(self, watched: _Watched) -> int | None:
        """The child's return code once it exited, after killing what is left of its group."""
        assert watched.proc is not None
        try:
            # WNOWAIT leaves the child a zombie, so its pid (= the group id) cannot be reused
            # while we clear out the rest of the group.
            info = os.waitid(os.P_PID, watched.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is None:
            return watched.proc.poll()
        procs.signal_group(watched.pid, signal.SIGKILL)
        # And what it started in groups of its own (an Atropos run's environment and API).
        procs.end_session_leftovers(watched.pid, watched.start)
        return watched.proc.wait()

    def _enforce_stop(self, run: Run, watched: _Watched) -> None:
        if not watched.term_sent:
            procs.signal_group(watched.pid, signal.SIGTERM)
            watched.term_sent = True
        requested = run.stop_requested_at or utcnow()
        if utcnow() - requested > timedelta(seconds=self._settings.stop_grace_s):
            if watched.proc is not None or procs.same_process_alive(watched.pid, watched.start):
                log.warning(
                    "run %s ignored SIGTERM for %ss: SIGKILL", run.id, self._settings.stop_grace_s
                )
                procs.signal_group(watched.pid, signal.SIGKILL)

    def _start_queued(self) -> None:
        with read_session(self._engine) as session:
            free = self._settings.max_concurrent_runs - lifecycle.count_active(session)
            if free <= 0:
                return
            queued = session.exec(
                select(Run)
                .where(Run.status == RunStatus.queued, col(Run.job_id).is_(None))
                .order_by(col(Run.created_at), col(Run.id))
                .limit(free)
            ).all()
        for run in queued:
            if self._settings.launcher == RAY_LAUNCHER:
                if not self.ray.start(run):
                    return  # Ray is unreachable: the queue waits, in order
            else:
                self._spawn(run.id)

    def _spawn(self, run_id: str) -> None:
        with write_session(self._engine) as session:
            run = session.get(Run, run_id)
            if run is None or not lifecycle.transition(session, run, RunStatus.starting):
                return
            run_dir = Path(run.run_dir)
        argv = [
            self._settings.python_executable,
            "-m",
            self._settings.runner_module,
            "--run-dir",
            str(run_dir),
        ]
        oom_before = exit_cause.read_counters()
        try:
            with RunFolder(run_dir).log.open("ab") as logfile:
                proc = subprocess.Popen(
                    argv,
                    cwd=PROJECT_ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    env=self._settings.child_environment(),
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            lifecycle.set_status(
                self._engine,
                run_id,
                RunStatus.failed,
                failure_kind="spawn",
                details=f"could not start the runner ({' '.join(argv[:3])}): {exc}",
            )
            return
        start = procs.process_start_time(proc.pid)
        earlier = self._watched.get(run_id)
        if earlier is not None and earlier.proc is not None:
            # The last attempt recorded its end and is still exiting: reap it when it does.
            _reap_in_background(earlier.proc)
        self._watched[run_id] = _Watched(proc.pid, start, proc, oom_before=oom_before)
        with write_session(self._engine) as session:
            run = session.get(Run, run_id)
            if run is not None:
                # Same status, new facts; the runner records `running` itself once it is up.
                lifecycle.transition(
                    session, run, RunStatus(run.status), pid=proc.pid, process_start=start
                )
        log.info("started run %s (pid %s)", run_id, proc.pid)

    # Settling ends -------------------------------------------------------------------------

    def _settle_exit(self, run_id: str, returncode: int, watched: _Watched) -> None:
        """Record how a child ended, unless the runner already recorded its own end."""
        # The only SIGKILL we send goes to a run that is `stopping` (settled below as stopped);
        # any other one came from elsewhere, most often the kernel's OOM killer.
        oom = (
            exit_cause.sigkill_evidence(watched.pid, watched.start, watched.oom_before)
            if returncode == -signal.SIGKILL
            else None
        )
        with write_session(self._engine) as session:
            run = session.get(Run, run_id)
            if run is None:
                return
            if run.pid != watched.pid:
                # Resumed since (a new attempt, queued with no pid yet): this exit is the end
                # of the earlier attempt, already recorded, and says nothing about the new one.
                return
            status = RunStatus(run.status)
            if status in FINISHED:
                lifecycle.transition(session, run, status, exit_code=returncode)
                return
            how = procs.describe_exit(returncode)
            if status == RunStatus.stopping:
                lifecycle.transition(
                    session,
                    run,
                    RunStatus.stopped,
                    exit_code=returncode,
                    details=f"stopped on request ({how}); no checkpoint was recorded at the stop"
                    if returncode != 0
                    else "stopped on request",
                )
                return
            kind, summary = exit_cause.classify_exit(returncode, how, oom)
            lifecycle.transition(
                session,
                run,
                RunStatus.failed,
                exit_code=returncode,
                failure_kind=kind,
                details=_with_log_tail(summary, run.run_dir),
            )

    def _settle_lost(self, run_id: str, why: str) -> None:
        with write_session(self._engine) as session:
            run = session.get(Run, run_id)
            if run is None or RunStatus(run.status) in FINISHED:
                return
            if run.status == RunStatus.stopping:
                lifecycle.transition(
                    session, run, RunStatus.stopped, details=f"stopped on request; {why}"
                )
                return
            lifecycle.transition(
                session,
                run,
                RunStatus.failed,
                failure_kind="lost",
                details=_with_log_tail(f"lost: {why}, and the runner recorded no end", run.run_dir),
            )


def _with_log_tail(summary: str, run_dir: str) -> str:
    lines = RunFolder(run_dir).log_tail(LOG_TAIL_LINES)
    if not lines:
        return f"{summary}. The log is empty."
    return f"{summary}. Last lines of train.log:\n" + "\n".join(lines)[-4000:]


def _reap_in_background(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
