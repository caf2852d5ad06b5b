"""The inference client process as the server sees it (`python -m runners.infer`): where a test
inference's environment code runs, out of the engine hosts. Started on first need, started again
after it died (an environment that called os._exit takes it down, and the requests it was
answering fail saying so; the hosts and their runs are untouched). It belongs to the server: the
end of its input ends it, however the server ends."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from core.child import Child
from core.infer_wire import FROM_WORKER, FromWorker, ToWorker
from core.run_folder import tail_lines
from core.settings import PROJECT_ROOT, Settings
from server.errors import Unavailable

log = logging.getLogger(__name__)
MODULE = "runners.infer"


class ClientLife:
    """One life of the process: what requests are sent on, and why it ended when it did."""

    def __init__(self, child: Child[FromWorker], log_path: Path) -> None:
        self.child = child
        self._log_path = log_path

    @property
    def alive(self) -> bool:
        return self.child.alive

    def send_infer(self, message: ToWorker) -> bool:
        return self.child.send(message)

    def why_gone(self) -> str:
        tail = "\n".join(tail_lines(self._log_path, 10))
        return (
            f"the inference client (pid {self.child.pid}, where environment code runs) ended "
            f"({self.child.exit_status()}). Last lines of its log ({self._log_path}):\n{tail}"
        )


class InferenceClient:
    def __init__(
        self,
        settings: Settings,
        on_message: Callable[[ClientLife, FromWorker], None],
        on_end: Callable[[ClientLife], None],
    ) -> None:
        self._settings = settings
        self._on_message = on_message
        self._on_end = on_end
        self._lock = threading.Lock()
        self._life: ClientLife | None = None
        self._closed = False
        self.starts = 0
        self.log_path: Path = settings.var_dir / "inference.log"

    @property
    def pid(self) -> int | None:
        life = self._life
        return life.child.pid if life is not None and life.alive else None

    def life(self) -> ClientLife:
        """The running process, started now if there is none."""
        with self._lock:
            if self._closed:
                raise Unavailable("the server is shutting down")
            if self._life is not None and self._life.alive:
                return self._life
            if self._life is not None:
                self._life.child.stop()  # it died: its pipes are closed, it is reaped
            lives: list[ClientLife] = []  # this life, for its own callbacks
            child: Child[FromWorker] = Child(
                "the inference client",
                [self._settings.python_executable, "-m", MODULE],
                FROM_WORKER,
                cwd=PROJECT_ROOT,
                env=self._settings.child_environment(),
                log_path=self.log_path,
                on_message=lambda message: self._on_message(lives[0], message),
                on_end=lambda _code: self._ended(lives),
            )
            lives.append(ClientLife(child, self.log_path))
            self._life = lives[0]
            self.starts += 1
            log.info("inference client started (pid %s)", child.pid)
            return self._life

    def _ended(self, lives: list[ClientLife]) -> None:
        if lives:  # else it died before its life was made: nothing was sent on it
            self._on_end(lives[0])

    def stop(self) -> None:
        """The server stops: the process ends with it."""
        with self._lock:
            self._closed = True
            life, self._life = self._life, None
        if life is not None:
            life.child.stop()
