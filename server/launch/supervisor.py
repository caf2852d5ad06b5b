"""The supervisor: starts queued runs through the configured launcher, has each launcher watch
the attempts it started (ends settled, stop grace enforced), and after a restart lets each
adopt or settle its unfinished runs (DESIGN §1, §4, §10, §12). One server per database supervises
(`Leadership`); the others stand by.

It runs as one asyncio task in the server's lifespan; each tick does its blocking work in
a thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Callable

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from core import lifecycle
from core.db import read_session
from core.models import Run, RunStatus
from core.settings import Settings
from server.launch.launcher import LOCAL_LAUNCHER, LauncherHealth, launcher_of
from server.launch.launchers import Launchers
from server.launch.leadership import Leadership

log = logging.getLogger(__name__)
WAITING = "waiting for room"  # how a wait reason starts (server/engine/room.py)


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        wait_reason: Callable[[Run], str | None] = lambda run: None,
    ) -> None:
        """`wait_reason`: why a queued run cannot start yet where it would run (its engine
        host has no room for its base), or None; asked of the local launcher's runs."""
        self._settings = settings
        self._engine = engine
        self._wait_reason = wait_reason
        self._lock = threading.Lock()
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.leadership = Leadership(engine)
        self.launchers = Launchers(settings, engine)

    def launcher_health(self) -> LauncherHealth:
        """What /health says of the launcher that starts new runs."""
        return self.launchers.configured().health()

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

    def _hand_over(self) -> None:
        """Another server may supervise now, or this one stops: stop watching (runs go on)."""
        with self._lock:
            for launcher in self.launchers.made():
                launcher.hand_over()

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
                    self._hand_over()
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
        """After a (re)start: each launcher adopts its unfinished runs or settles their end."""
        with self._lock:
            by_kind = self._slot_holders()
            # Every launcher looks, with runs or without: runs may have ended unwatched.
            for kind in set(by_kind) | {launcher.kind for launcher in self.launchers.made()}:
                self.launchers.get(kind).reconcile(by_kind.get(kind, []))

    def _slot_holders(self) -> dict[str, list[Run]]:
        """Runs holding a slot, by the launcher that started their current attempt."""
        with read_session(self._engine) as session:
            runs = session.exec(select(Run).where(lifecycle.holds_a_slot())).all()
        by_kind: dict[str, list[Run]] = defaultdict(list)
        for run in runs:
            by_kind[launcher_of(run)].append(run)
        return by_kind

    def _watch(self) -> None:
        by_kind = self._slot_holders()
        # Every launcher looks, with runs or without: a child that recorded its end still
        # has to be reaped when it exits.
        for kind in set(by_kind) | {launcher.kind for launcher in self.launchers.made()}:
            self.launchers.get(kind).watch(by_kind.get(kind, []))

    def _start_queued(self) -> None:
        with read_session(self._engine) as session:
            free = self._settings.concurrent_runs - lifecycle.count_active(session)
            if free <= 0:
                return
            queued = session.exec(
                select(Run)
                .where(Run.status == RunStatus.queued, col(Run.job_id).is_(None))
                .order_by(col(Run.created_at), col(Run.id))
                .limit(free)
            ).all()
        launcher = self.launchers.configured()
        for run in queued:
            if launcher.kind == LOCAL_LAUNCHER and self._waits(run):
                continue  # a run behind it on another base may fit
            if not launcher.start(run):
                return  # it cannot start runs now (Ray unreachable): the queue waits, in order

    def _waits(self, run: Run) -> bool:
        """Whether `run` waits for room, its details saying why (written when that changes)."""
        reason = self._wait_reason(run)
        if reason is not None and reason != run.details:
            lifecycle.record_fields(self._engine, run.id, details=reason)
            log.info("run %s waits: %s", run.id, reason)
        elif reason is None and run.details is not None and run.details.startswith(WAITING):
            lifecycle.record_fields(self._engine, run.id, details=None)
        return reason is not None
