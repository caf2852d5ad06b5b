"""Give one episode its own copy of the global `random` and `numpy.random` states: GEM seeds and
draws from the process-wide generators, so its calls run with the episode's state swapped in."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# The swap is only safe if no other GEM call swaps at the same time (threads in a server).
_lock = threading.RLock()


class RngSlot:
    """The global RNG states one episode sees; empty until its first use."""

    def __init__(self) -> None:
        self._state: tuple[Any, Any] | None = None

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within the block the globals hold this episode's state; after it, the caller's."""
        import numpy as np  # here, not at module level: the server imports this module

        with _lock:
            saved = (random.getstate(), np.random.get_state())
            if self._state is not None:
                random.setstate(self._state[0])
                np.random.set_state(self._state[1])
            try:
                yield
            finally:
                self._state = (random.getstate(), np.random.get_state())
                random.setstate(saved[0])
                np.random.set_state(saved[1])
