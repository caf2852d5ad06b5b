"""A reading taken on a thread, over and over, while a `with` block runs: the benchmarks'
peak-memory and what-is-loaded watches."""

from __future__ import annotations

import threading
from typing import Self


class Watch:
    """Calls `look` at once and then every `every` seconds on a daemon thread, from the
    block's start to its end (the thread joined as it ends). A subclass keeps what it saw."""

    def __init__(self, every: float, name: str | None = None) -> None:
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def look(self) -> None:
        raise NotImplementedError

    def _watch(self) -> None:
        while True:
            self.look()
            if self._stop.wait(self._every):
                return
