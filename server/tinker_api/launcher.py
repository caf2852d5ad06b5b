"""Tinker sessions as a launcher kind ("tinker-api") for the supervisor: never started from the
queue (a script's create_session starts one), stopped by ending the session, and watched by
the liveness of the server holding it. A session lives in that server's memory and what its
engine host holds for it goes with the server's connection, so a run whose holder is gone is
settled as lost; the holder itself settles the sessions that finish, go quiet or lose their
host (sessions/)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.engine import Engine

from core import procs
from core.models import TINKER_API, Run
from server.launch.launcher import LauncherHealth
from server.launch.settle import Ending, settle
from server.tinker_api.service import TinkerService

log = logging.getLogger(__name__)


class TinkerLauncher:
    kind = TINKER_API

    def __init__(self, engine: Engine, service: TinkerService) -> None:
        self._engine = engine
        self._service = service

    def health(self) -> LauncherHealth:
        return LauncherHealth(kind=self.kind, address=None, reachable=True, reason=None)

    def start(self, run: Run) -> bool:
        raise RuntimeError("Tinker sessions are started by their scripts, never from the queue")

    def reconcile(self, runs: list[Run]) -> None:
        self._settle_orphans(runs)

    def watch(self, runs: list[Run]) -> None:
        self._settle_orphans(runs)

    def request_stop(self, run: Run) -> None:
        self._service.request_stop(run.id)

    def log_text(self, run: Run) -> str | None:
        return None  # the session's story is in its run folder's train.log

    def hand_over(self) -> None:
        pass  # sessions belong to the server holding them, not to the supervisor

    def _settle_orphans(self, runs: list[Run]) -> None:
        for run in runs:
            if self._service.holds(run.id):
                continue
            if run.pid is not None and procs.same_process_alive(run.pid, run.process_start):
                continue  # its server lives (this one, about to record its end, or another)
            log.info("Tinker session %s lost its server; settling it", run.id)
            settle(
                self._engine,
                run.id,
                Ending(
                    exit_code=None,
                    stop_details="stopped; the server holding the Tinker session is gone",
                    failure_kind="lost",
                    summary="lost: the server holding this Tinker session stopped (a session "
                    "lives in its server, and what its engine host held for it goes with it)",
                ),
                same_attempt=_held_by(run.pid),
            )


def _held_by(pid: int | None) -> Callable[[Run], bool]:
    """The row is still the one that process held (not a later session reusing nothing)."""

    def same(row: Run) -> bool:
        return row.pid == pid

    return same
