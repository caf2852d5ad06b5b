"""A cancel event that also tells whoever asked to hear of it: a sample running in an engine host
(runners/backends/engine_backend.py) is stopped there when its job's event is set here."""

from __future__ import annotations

import threading
from collections.abc import Callable


class CancelEvent(threading.Event):
    """A `threading.Event` (the local engine reads it at each decode step) whose `set` also
    calls back what `on_set` registered, once."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> None:
        """`callback` once the event is set (at once if it is)."""
        with self._callbacks_lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return
        callback()
