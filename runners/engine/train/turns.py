"""A training client's worker: its requests one at a time, in order, on a thread of its own.
Requests on the model hold the base's lock; a client keeps it across the requests it queued
back to back, to the end of its step (optim_step), so clients on one base take turns by whole
steps. By single requests, N clients' steps went fb, fb, ..., optim, optim: every client
waited for all of them to train, then all sampled at once while the lock sat idle.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from runners.engine import openmp
from runners.engine.fair_lock import FairLock
from runners.engine.futures import LocalFuture, task

T = TypeVar("T")
MAX_TURN = 8  # requests in one turn at most, so a client that queues without end yields


class Hold(Enum):
    MODEL = "model"  # runs under the base's lock; the turn goes on if more is queued
    STEP_END = "step_end"  # the same, and the turn ends after it (optim_step)
    NONE = "none"  # needs no lock (this client's own tensors); runs in a turn if one is held


class TurnWorker:
    def __init__(self, lock: FairLock, name: str = "local-train") -> None:
        self._lock = lock
        self._queue: deque[tuple[Hold, Callable[[], None]]] = deque()
        self._ready = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, hold: Hold, fn: Callable[..., T], *args: Any) -> LocalFuture[T]:
        fut, work = task(fn, *args)
        with self._ready:
            if self._closing:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.append((hold, work))
            self._ready.notify()
        return fut

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """No more requests; with `cancel_futures` the queued ones never run (their futures
        stay pending), else they finish first."""
        with self._ready:
            self._closing = True
            if cancel_futures:
                self._queue.clear()
            self._ready.notify()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def _serve(self) -> None:
        held = 0  # requests run in this turn; 0: the lock is not held
        try:
            while (item := self._next()) is not None:
                hold, work = item
                if hold is not Hold.NONE and not held:
                    self._lock.acquire()
                if held or hold is not Hold.NONE:
                    held += 1
                work()
                idle = not self._queued()
                if held and (hold is Hold.STEP_END or held >= MAX_TURN or idle):
                    self._lock.release()
                    held = 0
                if idle:  # nothing more for now: its OpenMP workers go (openmp.py)
                    openmp.give_back_workers()
        finally:
            if held:
                self._lock.release()

    def _next(self) -> tuple[Hold, Callable[[], None]] | None:
        with self._ready:
            while not self._queue and not self._closing:
                self._ready.wait()
            return self._queue.popleft() if self._queue else None

    def _queued(self) -> bool:
        with self._ready:
            return bool(self._queue)
