"""An engine host's clients: a connection per client accepted on the host's socket (its own
user only), a watchdog that releases clients silent past their timeout, the host's end once no
client has been connected for `idle_s` (or on SIGTERM), and its state as `Status` says it: its
slot and device, memory, bases (loaded, and claimed by clients placed here), lanes and clients.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import defaultdict

from core.engine_slots import Slot
from core.engine_wire import TO_HOST, WIRE, BaseHeld, LaneHeld, Status, Welcome
from core.line_socket import LineSocket, same_user
from core.model_names import weight_bytes
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
        slot: Slot,
        started_at: float,
        budget_bytes: int | None,
        client_timeout_s: float,
        idle_s: float,
    ) -> None:
        self._listener = listener
        self._service = service
        self._inference = inference
        self._slot = slot
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
            wire=WIRE,
            pid=os.getpid(),
            started_at=self._started_at,
            device=self._service.device,
            slot=self._slot.name,
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
            connections = [c for c in self._connections if c.hello is not None]
        loaded = self._service.bases.loaded()
        bases = [BaseHeld(name=n, bytes=b, users=u) for n, b, u in loaded]
        bases += self._claimed({name for name, _, _ in loaded}, connections)
        resident, waiting = self._service.sampling_load()
        total, free = device_memory()
        return Status(
            id=ask_id,
            pid=os.getpid(),
            started_at=self._started_at,
            wire=WIRE,
            slot=self._slot.name,
            device=self._service.device,
            device_bytes=total,
            device_free_bytes=free,
            rss_bytes=rss_bytes(),
            budget_bytes=self._budget_bytes,
            bases=bases,
            lanes=[LaneHeld(**lane) for lane in self._service.bases.lanes()],
            adapters_resident=resident,
            decode_queue=waiting,
            clients=[c.seen() for c in connections],
        )

    def _claimed(self, loaded: set[str], connections: list[Connection]) -> list[BaseHeld]:
        """Bases clients placed here claimed and that are not loaded yet (a claim whose base is
        loaded has served: the base counts for itself from then on)."""
        claimants: dict[str, int] = defaultdict(int)
        for connection in connections:
            for base in connection.claims(loaded):
                claimants[base] += 1
        models = self._service.models_dir
        return [
            BaseHeld(name=name, bytes=weight_bytes(name, models) or 0, users=count, loaded=False)
            for name, count in sorted(claimants.items())
        ]

    def _open(self, connection: Connection) -> None:
        if not connection.start():
            self._gone(connection)

    def _gone(self, connection: Connection) -> None:
        with self._lock:
            if connection in self._connections:
                self._connections.remove(connection)
            last = not any(c.hello is not None for c in self._connections)
            if connection.hello is not None and last:  # a probe's end is no client's
                self._alone_since = time.monotonic()

    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_S):
            now = time.monotonic()
            with self._lock:
                connections = list(self._connections)
                clients = [c for c in connections if c.hello is not None]
                alone_for = now - self._alone_since if not clients else 0.0
            for connection in clients:
                silent = now - connection.last_seen
                if silent > self._client_timeout_s:
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


def device_memory() -> tuple[int | None, int | None]:
    """The GPU's memory and what is free on it now; (None, None) on the CPU."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    free, total = torch.cuda.mem_get_info()
    return int(total), int(free)


def rss_bytes() -> int:
    """This process's resident memory (Linux; 0 elsewhere)."""
    try:
        pages = int(open("/proc/self/statm").read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")
