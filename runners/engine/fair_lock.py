"""A reentrant lock granted in the order it was asked for: clients training on one base model
take turns first come, first served (`threading.RLock` hands it to whichever waiter the
scheduler wakes, so a client that asks again at once can keep it)."""

from __future__ import annotations

import threading
from collections import deque
from types import TracebackType


class FairLock:
    """Reentrant; on release the longest-waiting thread owns it next (handed over, not raced)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._waiting: deque[tuple[int, threading.Event]] = deque()

    def acquire(self) -> bool:
        me = threading.get_ident()
        with self._mutex:
            if self._owner == me:
                self._depth += 1
                return True
            if self._owner is None:
                self._owner, self._depth = me, 1
                return True
            turn = threading.Event()
            self._waiting.append((me, turn))
        turn.wait()  # release() made this thread the owner before setting it
        return True

    def release(self) -> None:
        with self._mutex:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a FairLock this thread does not hold")
            self._depth -= 1
            if self._depth:
                return
            if self._waiting:
                self._owner, turn = self._waiting.popleft()
                self._depth = 1
                turn.set()
            else:
                self._owner = None

    def held(self) -> bool:
        """Whether a thread holds it now."""
        with self._mutex:
            return self._owner is not None

    def waiting(self) -> int:
        """Threads waiting for it now."""
        with self._mutex:
            return len(self._waiting)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()
