"""Requests sent on a line-protocol wire and not yet answered, by the id each went out with:
what its answer goes to. One table per connection (or per sender); thread-safe."""

from __future__ import annotations

import itertools
import threading
from typing import Generic, TypeVar

W = TypeVar("W")  # what an answer goes to: a future, a queue, a callback


class PendingCalls(Generic[W]):
    """Once ended (its connection gone) it takes no more: a request sent then would wait for
    an answer that cannot come."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._by_id: dict[int, W] = {}
        self.ended: str | None = None  # why, once ended

    def add(self, waiter: W) -> int | None:
        """The id to send the request with (before sending: its answer may come at once);
        None once ended."""
        with self._lock:
            if self.ended is not None:
                return None
            call_id = next(self._ids)
            self._by_id[call_id] = waiter
            return call_id

    def get(self, call_id: int | None) -> W | None:
        with self._lock:
            return self._by_id.get(call_id) if call_id is not None else None

    def pop(self, call_id: int | None) -> W | None:
        with self._lock:
            return self._by_id.pop(call_id, None) if call_id is not None else None

    def waiting(self) -> list[W]:
        with self._lock:
            return list(self._by_id.values())

    def end(self, why: str) -> list[W]:
        """No answer will come: what was still waiting, to be told so."""
        with self._lock:
            self.ended = why
            waiting, self._by_id = list(self._by_id.values()), {}
        return waiting
