"""The server's connection to one engine host (one per slot of this machine, server/engine/
hosts.py holds them), made on first need (starting the host if none runs) and made again after
the host died. The Tinker API and inference subscribe to what comes back: each hears its own
replies, and that the host is gone."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core import engine_host
from core.engine_client import EngineClient
from core.engine_host import HostUnavailable
from core.engine_slots import Slot
from core.engine_wire import Status
from core.infer_wire import FromWorker
from core.settings import Settings
from core.tinker_wire import Reply
from server.errors import Unavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listener:
    on_tinker: Callable[[EngineClient, Reply], None] = lambda client, reply: None
    on_infer: Callable[[EngineClient, FromWorker], None] = lambda client, message: None
    on_end: Callable[[EngineClient, str], None] = lambda client, why: None


class EngineLink:
    def __init__(self, settings: Settings, slot: Slot) -> None:
        self._settings = settings
        self.slot = slot
        self.var_dir = settings.var_dir
        self._lock = threading.Lock()
        self._client: EngineClient | None = None
        self._listeners: list[Listener] = []
        self._closed = False
        self.connects = 0  # connections made (a new host, or the same after a cut)

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    @property
    def log_path(self) -> Path:
        return engine_host.log_path(self.var_dir, self.slot)

    @property
    def pid(self) -> int | None:
        client = self._client
        return client.pid if client is not None and client.alive else None

    def client(self) -> EngineClient:
        """The live connection, made now if there is none (it may start the host: seconds;
        keep it off an event loop). Unavailable when the host cannot be reached."""
        with self._lock:
            if self._closed:
                raise Unavailable("the server is shutting down")
            client = self._client
            if client is not None and client.alive:
                return client
            try:
                made = EngineClient(self._settings, "server", "server", self.slot)
            except HostUnavailable as exc:
                raise Unavailable(str(exc)) from None
            self._client = client = made.start(
                on_tinker=lambda reply: self._tinker(made, reply),
                on_infer=lambda message: self._infer(made, message),
                on_end=lambda why: self._end(made, why),
            )
            self.connects += 1
            log.info("connected to the engine host %s (pid %s)", self.slot.name, client.pid)
            return client

    def status(self) -> Status:
        try:
            return self.client().status()
        except HostUnavailable as exc:
            raise Unavailable(str(exc)) from None

    def close(self) -> None:
        """The server stops: it leaves the host (which goes on for its runs)."""
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _tinker(self, client: EngineClient, reply: Reply) -> None:
        for listener in self._listeners:
            listener.on_tinker(client, reply)

    def _infer(self, client: EngineClient, message: FromWorker) -> None:
        for listener in self._listeners:
            listener.on_infer(client, message)

    def _end(self, client: EngineClient, why: str) -> None:
        log.warning("%s", why)
        for listener in self._listeners:
            listener.on_end(client, why)
