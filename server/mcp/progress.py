"""Progress notifications for a tool call that waits, sent while the wait runs (only when the
client asked for them with a progressToken)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mcp.server.session import ServerSession
from mcp.shared.context import RequestContext

T = TypeVar("T")
EVERY_S = 0.5  # how often a wait looks for news to report (a database read of one row)
# What changed, as (progress, total, message); None when there is nothing new to say.
Probe = Callable[[], Awaitable[tuple[float, float | None, str] | None]]


class Progress:
    def __init__(self, ctx: RequestContext[ServerSession, Any, Any] | None) -> None:
        self._ctx = ctx
        meta = ctx.meta if ctx is not None else None
        self.token = meta.progressToken if meta is not None else None

    async def send(self, progress: float, total: float | None, message: str) -> None:
        if self._ctx is None or self.token is None:
            return
        await self._ctx.session.send_progress_notification(
            self.token, progress, total, message, related_request_id=str(self._ctx.request_id)
        )

    async def during(self, wait: Awaitable[T], probe: Probe) -> T:
        """Await `wait`, reporting what `probe` finds every EVERY_S, and once more at the end.
        A cancelled call cancels both; nothing else is touched."""
        if self.token is None:
            return await wait

        async def report() -> None:
            while True:
                if news := await probe():
                    await self.send(*news)
                await asyncio.sleep(EVERY_S)

        reporter = asyncio.ensure_future(report())
        try:
            answer = await wait
        finally:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
        if news := await probe():
            await self.send(*news)
        return answer
