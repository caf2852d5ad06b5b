"""How a Tinker session ends when its script does not end it: gone quiet (it died, or ended
without closing), or stopped through our API (POST /runs/{id}/stop, on any server sharing the
database); and old results and long-ended sessions forgotten. One sweep a tick, on the loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from core.models import RunStatus
from server.tinker_api.sessions.hub import SessionHub
from server.tinker_api.sessions.session import Session

log = logging.getLogger(__name__)
# Quiet sessions are counted in tens of seconds, and a stop asked of this server ends its
# session at once (request_stop): a second between sweeps is enough, and costs the worker's
# cores nothing worth measuring.
SWEEP_S = 1.0
EXPIRE_S = 60.0


class SessionSweeper:
    def __init__(self, hub: SessionHub, expire: Callable[[], list[str]] | None = None) -> None:
        self._hub = hub
        # Checkpoints past their time to live are deleted (blocking: on the recorder's thread)
        # once a minute: TTLs are an hour at least.
        self._expire = expire
        self._next_expiry = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._sweep_forever(), name="tinker-sweeper")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def request_stop(self, run_id: str) -> None:
        """POST /runs/{id}/stop marked the run stopping (any thread): end the session now."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop_if_held, run_id)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self.sweep()
            except Exception:  # a bad sweep must not end the sweeping
                log.exception("Tinker session sweep failed")

    async def sweep(self) -> None:
        """Sessions whose script went quiet end (lost); those stopped through our API (on any
        server) end (stopped); old results and long-ended sessions are forgotten."""
        hub = self._hub
        hub.futures.expire()
        timeout = hub.settings.tinker_session_timeout_s
        live = [s for s in hub.sessions.values() if s.ended is None]
        for session in live:
            quiet = session.quiet_for()
            if quiet > timeout:
                self._went_quiet(session, quiet, timeout)
        live_ids = [s.id for s in live if s.ended is None]
        if live_ids:
            for run_id in await hub.recorder.read(hub.records.stopping, live_ids):
                self._stop_if_held(run_id)
        hub.forget_ended()
        if self._expire is not None and hub.clock() >= self._next_expiry:
            self._next_expiry = hub.clock() + EXPIRE_S
            for path in await hub.recorder.read(self._expire):
                log.info("deleted %s: its time to live passed", path)

    def _went_quiet(self, session: Session, quiet: float, timeout: float) -> None:
        """Its script sent nothing for too long: the SDK heartbeats every 10 s while its
        process lives, so the process is gone. With answers it never had, it died mid-work
        (lost); with all it asked answered, it most likely ended without closing its session
        (succeeded, saying so): the server cannot tell those apart any better."""
        unfinished = self._hub.futures.unfinished(session.id)
        silence = (
            f"the script sent nothing (not even a heartbeat, which the SDK sends every 10 s) "
            f"for {quiet:.0f} s (RLCS_TINKER_SESSION_TIMEOUT_S={timeout:g})"
        )
        if unfinished:
            details = (
                f"lost: {silence} with {unfinished} request(s) unanswered: it died or lost its "
                "connection. Its models were freed."
            )
            self._hub.end(
                session,
                RunStatus.failed,
                "lost",
                f"its script sent nothing for {quiet:.0f} s",
                details,
            )
        else:
            details = (
                f"{silence}, every request answered: the script most likely ended without "
                "closing its session (ServiceClient.close(), or `with ServiceClient()`, ends a "
                "run at once). Its models were freed."
            )
            self._hub.end(session, RunStatus.succeeded, None, "its script went quiet", details)

    def _stop_if_held(self, run_id: str) -> None:
        session = self._hub.sessions.get(run_id)
        if session is not None and session.ended is None:
            self._hub.end(
                session,
                RunStatus.stopped,
                None,
                f"it was stopped through the control server (POST /runs/{run_id}/stop)",
                f"stopped on request (POST /runs/{run_id}/stop): the session ended and its "
                "models were freed",
            )
