"""Tinker's futures as the server keeps them: each request's result (JSON or protobuf bytes, or
an error with its category) by request id, a long poll that holds a client until the result
is there or a while has passed, and a time to live once settled.

Everything here runs on the server's event loop (the worker's answers are handed over with
call_soon_threadsafe), so it needs no lock.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

JSON = "application/json"
MAX_COMPLETIONS = 10_000  # per poll target: a poller that never comes back loses the oldest
PROTO = "application/x-protobuf"


@dataclass(frozen=True)
class Outcome:
    """A settled future: a payload (`content_type`, `body`) or an error (`error`, `category`)."""

    content_type: str = JSON
    body: bytes = b""
    error: str | None = None
    category: str = "user"


@dataclass(frozen=True)
class Completion:
    cursor: int
    request_id: str
    failed: bool


@dataclass
class Pending:
    request_id: str
    session_id: str
    kind: str
    target: str | None = None  # a sample's sampler (and clone): retrieve_futures polls it
    done: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: Outcome | None = None
    settled_at: float | None = None
    retrieved: bool = False  # its client has had the outcome


class FutureRegistry:
    def __init__(self, clock: Callable[[], float], ttl_s: float) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._futures: dict[str, Pending] = {}
        # retrieve_futures: each target's settled requests in order, numbered by one cursor.
        self._completions: dict[str, deque[Completion]] = {}
        self._cursor = 0
        self._completed = asyncio.Event()

    def new(
        self,
        session_id: str,
        kind: str,
        target: str | None = None,
        request_id: str | None = None,
    ) -> Pending:
        """A future; its id made here unless the caller made it first (new_id)."""
        request_id = request_id or self.new_id(session_id, kind)
        pending = Pending(request_id, session_id, kind, target)
        self._futures[request_id] = pending
        return pending

    @staticmethod
    def new_id(session_id: str, kind: str) -> str:
        return f"{session_id}:{kind}:{secrets.token_hex(8)}"

    def get(self, request_id: str) -> Pending | None:
        return self._futures.get(request_id)

    def settle(self, request_id: str, outcome: Outcome) -> Pending | None:
        """Record a result once; a second one (a late answer of a failed request) is ignored."""
        pending = self._futures.get(request_id)
        if pending is None or pending.outcome is not None:
            return None
        pending.outcome = outcome
        pending.settled_at = self._clock()
        pending.done.set()
        if pending.target is not None:
            self._cursor += 1
            log = self._completions.setdefault(pending.target, deque(maxlen=MAX_COMPLETIONS))
            log.append(Completion(self._cursor, request_id, outcome.error is not None))
            self._completed.set()
            self._completed = asyncio.Event()
        return pending

    def cancel(self, request_id: str) -> bool:
        """cancel_future: the request fails now, saying so (work already taken still runs;
        its answer is dropped). False if it was settled already."""
        error = "cancelled by its client (cancel_future)"
        return self.settle(request_id, Outcome(error=error, category="user")) is not None

    async def completions(
        self, target: str, after: int, hold_s: float, retrieved: list[str]
    ) -> tuple[list[Completion], int]:
        """retrieve_futures: `target`'s requests settled after cursor `after` (waiting up to
        `hold_s` for one), and the cursor to pass next; those seen are trimmed, and
        `retrieved` requests' results forgotten."""
        for request_id in retrieved:
            pending = self._futures.get(request_id)
            if pending is not None and pending.target == target and pending.outcome is not None:
                pending.retrieved = True
        log = self._completions.setdefault(target, deque(maxlen=MAX_COMPLETIONS))
        while log and log[0].cursor <= after:
            log.popleft()
        deadline = self._clock() + hold_s
        while not log and self._clock() < deadline:
            try:
                await asyncio.wait_for(self._completed.wait(), deadline - self._clock())
            except TimeoutError:
                break
        found = list(log)
        return found, found[-1].cursor if found else max(after, 0)

    def unfinished(self, session_id: str) -> int:
        """A session's requests whose outcome its client has not had (yet)."""
        return sum(
            1 for p in self._futures.values() if p.session_id == session_id and not p.retrieved
        )

    def fail_session(self, session_id: str, error: str, category: str) -> None:
        """Every unsettled future of a session fails with `error` (its session ended)."""
        for pending in list(self._futures.values()):
            if pending.session_id == session_id and pending.outcome is None:
                self.settle(pending.request_id, Outcome(error=error, category=category))

    async def wait(
        self,
        request_id: str,
        hold_s: float,
        gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> Outcome | None:
        """The outcome, waiting up to `hold_s` for it; None if it is not there yet, or the
        client went away meanwhile (`gone`, asked every second). KeyError for a request id
        this server does not hold (never made, or expired)."""
        pending = self._futures[request_id]
        deadline = self._clock() + hold_s
        while pending.outcome is None:
            left = deadline - self._clock()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(asyncio.shield(pending.done.wait()), min(left, 1.0))
            except TimeoutError:
                if gone is not None and await gone():
                    return None
        pending.retrieved = True
        return pending.outcome

    def expire(self) -> int:
        """Forget results settled longer ago than the time to live; how many."""
        limit = self._clock() - self._ttl_s
        old = [
            request_id
            for request_id, pending in self._futures.items()
            if pending.settled_at is not None and pending.settled_at < limit
        ]
        for request_id in old:
            del self._futures[request_id]
        return len(old)

    def __len__(self) -> int:
        return len(self._futures)
