"""The engine host's clients: a connection per client accepted on the host's socket (its own
user only), a watchdog that releases clients silent past their timeout, and the host's end once
no client has been connected for `idle_s` (or on SIGTERM)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from core.engine_wire import TO_HOST, WIRE, BaseHeld, Status, Welcome
from core.line_socket import LineSocket, same_user
from runners.engine.local import LocalServiceClient
from runners.engine_host.connection import Connection
from runners.engine_host.inference import InferenceLoop

log = logging.getLogger("engine-host")
WATCH_S = 1.0  # how often the watchdog looks
ACCEPT_WAKE_S = 1.0


class EngineHost:
    def __init__(
        self,
        listener: socket.socket,
        service: LocalServiceClient,
        inference: InferenceLoop,
        *,
        started_at: float,
        budget_bytes: int | None,
        client_timeout_s: float,
        idle_s: float,
    ) -> None:
        self._listener = listener
        self._service = service
        self._inference = inference
        self._started_at = started_at
        self._budget_bytes = budget_bytes
        self._client_timeout_s = client_timeout_s
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._connections: list[Connection] = []
        self._alone_since = time.monotonic()
        self._stopping = threading.Event()

    def serve(self) -> None:
        """Accept clients until `stop` (or the idle time ran out)."""
        threading.Thread(target=self._watch, daemon=True, name="watchdog").start()
        welcome = Welcome(
            wire=WIRE, pid=os.getpid(), started_at=self._started_at, device=self._service.device
        )
        # Woken each second to see whether the host is ending (closing a listener from another
        # thread does not wake an accept blocked on it).
        self._listener.settimeout(ACCEPT_WAKE_S)
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break  # the listener was closed: the host ends
            sock.settimeout(None)
            if not same_user(sock):
                log.warning("refused a connection from another user")
                sock.close()
                continue
            channel: LineSocket = LineSocket(sock, TO_HOST, "a client")
            connection = Connection(
                channel, self._service, self._inference, self.status, self._gone, welcome
            )
            with self._lock:
                self._connections.append(connection)
            # The handshake on a thread: a client slow to say hello holds nobody else up.
            threading.Thread(target=self._open, args=(connection,), daemon=True).start()

    def stop(self) -> None:
        """Take no client more (one that connects now is refused and starts another host once
        this one has let its lock go), and cut off the ones there."""
        self._stopping.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.close()

    def status(self, ask_id: int) -> Status:
        with self._lock:
            clients = [c.seen() for c in self._connections if c.hello is not None]
        bases = [BaseHeld(name=n, bytes=b, users=u) for n, b, u in self._service.bases.loaded()]
        resident, waiting = self._service.sampling_load()
        return Status(
            id=ask_id,
            pid=os.getpid(),
            started_at=self._started_at,
            wire=WIRE,
            budget_bytes=self._budget_bytes,
            bases=bases,
            adapters_resident=resident,
            decode_queue=waiting,
            clients=clients,
        )

    def _open(self, connection: Connection) -> None:
        if not connection.start():
            self._gone(connection)

    def _gone(self, connection: Connection) -> None:
        with self._lock:
            if connection in self._connections:
                self._connections.remove(connection)
            if not self._connections:
                self._alone_since = time.monotonic()

    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_S):
            now = time.monotonic()
            with self._lock:
                connections = list(self._connections)
                alone_for = now - self._alone_since if not connections else 0.0
            for connection in connections:
                silent = now - connection.last_seen
                if connection.hello is not None and silent > self._client_timeout_s:
                    log.warning(
                        "client %s sent nothing for %.0f s (RLCS_ENGINE_CLIENT_TIMEOUT_S): "
                        "released",
                        connection.name,
                        silent,
                    )
                    connection.close()
            if alone_for > self._idle_s:
                log.info("no client for %.0f s (RLCS_ENGINE_IDLE_S): exiting", alone_for)
                self.stop()
