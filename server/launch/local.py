"""The `local` launcher: each attempt is a child process of this server (`python -m
runners.train --run-dir DIR`), started in its own session so a stop signals its whole process
group and the server dying never kills it. After a restart, runs whose process still lives (same
pid and start time) are adopted; the others are settled as lost (DESIGN §1, §4, §10, §12)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy import or_
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from core import lifecycle, procs
from core.db import read_session, write_session
from core.models import FINISHED, Run, RunStatus, utcnow
from core.run_folder import RunFolder
from core.settings import PROJECT_ROOT, Settings
from server.launch import exit_cause
from server.launch.launcher import LOCAL_LAUNCHER, LauncherHealth, runner_argv
from server.launch.settle import Ending, settle

log = logging.getLogger(__name__)
# How far back a restart looks for runs that ended while no server watched them (their
# sessions' leftovers are cleared): longer than a server is ever down.
UNWATCHED_ENDS = timedelta(days=7)


@dataclass
class _Watched:
    pid: int
    start: float | None
    proc: subprocess.Popen[bytes] | None  # None for runs adopted after a restart
    term_sent: bool = False
    # The kernel's oom_kill counters at spawn: a SIGKILL we did not send is an OOM kill when
    # they rose meanwhile.
    oom_before: exit_cause.OomCounters | None = None


class LocalLauncher:
    kind = LOCAL_LAUNCHER

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self._settings = settings
        self._engine = engine
        self._watched: dict[str, _Watched] = {}

    def health(self) -> LauncherHealth:
        return LauncherHealth(kind=self.kind, address=None, reachable=True, reason=None)

    # Starting ------------------------------------------------------------------------------

    def start(self, run: Run) -> bool:
        run_dir = self._claim(run.id)
        if run_dir is None:
            return True  # stopped meanwhile: nothing to start, the queue goes on
        argv = runner_argv(self._settings, run_dir)
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
                run.id,
                RunStatus.failed,
                failure_kind="spawn",
                details=f"could not start the runner ({' '.join(argv[:3])}): {exc}",
            )
            return True
        self._record_started(run.id, proc, oom_before)
        log.info("started run %s (pid %s)", run.id, proc.pid)
        return True

    def _claim(self, run_id: str) -> Path | None:
        """Mark the queued run starting; its folder, or None when it was stopped meanwhile."""
        with write_session(self._engine) as session:
            row = session.get(Run, run_id)
            if row is None or not lifecycle.transition(session, row, RunStatus.starting):
                return None
            return Path(row.run_dir)

    def _record_started(
        self, run_id: str, proc: subprocess.Popen[bytes], oom_before: exit_cause.OomCounters
    ) -> None:
        """Watch the new process, and record it (pid, start time) on the run."""
        start = procs.process_start_time(proc.pid)
        earlier = self._watched.get(run_id)
        if earlier is not None and earlier.proc is not None:
            # The last attempt recorded its end and is still exiting: reap it when it does.
            _reap_in_background(earlier.proc)
        self._watched[run_id] = _Watched(proc.pid, start, proc, oom_before=oom_before)
        with write_session(self._engine) as session:
            row = session.get(Run, run_id)
            if row is not None:
                # Same status, new facts; the runner records `running` itself once it is up.
                lifecycle.transition(
                    session,
                    row,
                    RunStatus(row.status),
                    launcher=self.kind,
                    pid=proc.pid,
                    process_start=start,
                )

    # Watching ------------------------------------------------------------------------------

    def reconcile(self, runs: list[Run]) -> None:
        for run in runs:
            self._adopt_or_settle(run, "the server restarted and found its process gone")
        self._clear_unwatched_ends()

    def _clear_unwatched_ends(self) -> None:
        """What runs that ended while no server watched them left running in their sessions
        (a run that finished between a server's death and its restart): killed now, as a
        watching server would have. Only processes started within a run's lifetime count."""
        since = utcnow() - UNWATCHED_ENDS
        with read_session(self._engine) as session:
            ended = session.exec(
                select(Run.pid, Run.process_start, Run.finished_at).where(
                    col(Run.status).in_([s.value for s in FINISHED]),
                    col(Run.pid).is_not(None),
                    col(Run.finished_at) >= since,
                    or_(col(Run.launcher).is_(None), col(Run.launcher) == LOCAL_LAUNCHER),
                )
            ).all()
        spans = {
            pid: (start, procs.ticks_at(finished.timestamp()) if finished else None)
            for pid, start, finished in ended
            if pid is not None
        }
        killed = procs.end_sessions_leftovers(spans)
        if killed:
            log.info("ended %s process(es) left by runs that ended unwatched", len(killed))

    def watch(self, runs: list[Run]) -> None:
        active = {run.id: run for run in runs}
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
                self._settle_lost(
                    run_id, watched.pid, "its process ended while this server was not its parent"
                )
                continue
            if run is not None and run.status == RunStatus.stopping:
                self._enforce_stop(run, watched)
        # Active in the database but not watched: another server instance's, or lost.
        for run_id, run in active.items():
            if run_id not in self._watched and run.status != RunStatus.starting:
                self._adopt_or_settle(run, "no process is running it")

    def request_stop(self, run: Run) -> None:
        # The supervisor sends SIGKILL when the grace period passes; SIGTERM goes out now.
        if run.pid is not None and procs.same_process_alive(run.pid, run.process_start):
            procs.signal_group(run.pid, signal.SIGTERM)

    def log_text(self, run: Run) -> str | None:
        return None  # the runner writes the run folder's train.log

    def hand_over(self) -> None:
        """Runs we started outlive us; while this process lives on (a test, an embedding app),
        each is still reaped when it exits, so none lingers as a zombie."""
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
        self._watched.clear()

    def _adopt_or_settle(self, run: Run, why_lost: str) -> None:
        """Watch a run this server did not start if its process lives; else it is lost."""
        if run.pid is not None and procs.same_process_alive(run.pid, run.process_start):
            self._watched[run.id] = _Watched(run.pid, run.process_start, None)
            log.info("adopted run %s (pid %s)", run.id, run.pid)
            return
        if run.pid is not None:
            procs.end_session_leftovers(run.pid, run.process_start)
        self._settle_lost(run.id, run.pid, why_lost)

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

    # Settling ends -------------------------------------------------------------------------

    def _settle_exit(self, run_id: str, returncode: int, watched: _Watched) -> None:
        """A child this server started has exited."""
        # The only SIGKILL we send goes to a run that is `stopping` (settled as stopped);
        # any other one came from elsewhere, most often the kernel's OOM killer.
        oom = (
            exit_cause.sigkill_evidence(watched.pid, watched.start, watched.oom_before)
            if returncode == -signal.SIGKILL
            else None
        )
        how = procs.describe_exit(returncode)
        kind, summary = exit_cause.classify_exit(returncode, how, oom)
        ending = Ending(
            exit_code=returncode,
            stop_details="stopped on request"
            if returncode == 0
            else f"stopped on request ({how}); no checkpoint was recorded at the stop",
            failure_kind=kind,
            summary=summary,
        )
        # A resumed run has a new attempt queued with no pid yet: this exit is the earlier
        # attempt's, already recorded, and says nothing about the new one.
        settle(self._engine, run_id, ending, lambda row: row.pid == watched.pid)

    def _settle_lost(self, run_id: str, pid: int | None, why: str) -> None:
        """An attempt whose process is gone and that nobody saw exit."""
        ending = Ending(
            exit_code=None,
            stop_details=f"stopped on request; {why}",
            failure_kind="lost",
            summary=f"lost: {why}, and the runner recorded no end",
        )
        settle(self._engine, run_id, ending, lambda row: row.pid == pid)


def _reap_in_background(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
