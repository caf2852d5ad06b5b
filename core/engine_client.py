"""A client's connection to one engine host of its machine (core/engine_host.py starts or finds
it; core/engine_placement.py chooses it): the handshake (`Hello`, answered by `Welcome`), then,
once `start`ed, a beat every BEAT_S so the host knows the client is alive, and the host's lines
handed on by kind: Tinker replies to `on_tinker`, inference replies to `on_infer`, status answers
(to an `Ask` or a `Claim`) to whoever asked. `on_end` hears once that the host is gone (it died,
or closed this connection); a new `EngineClient` connects again.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal

from core import engine_host
from core.engine_slots import Slot, plan
from core.engine_wire import (
    FROM_HOST,
    WIRE,
    Ask,
    Beat,
    Claim,
    FromHost,
    Hello,
    InferCall,
    InferReply,
    Status,
    TinkerCall,
    TinkerReply,
    Turned,
    Welcome,
)
from core.infer_wire import FromWorker, ToWorker
from core.line_socket import LineSocket
from core.run_folder import tail_lines
from core.settings import Settings
from core.tinker_wire import Op, Reply

log = logging.getLogger(__name__)
BEAT_S = 5.0
HANDSHAKE_S = 30.0
CONNECT_TRIES = 3


class EngineLost(RuntimeError):
    """The engine host went while a client used it (what the client made there went too)."""


def _connect(
    settings: Settings, slot: Slot, hello: Hello, start_timeout_s: float
) -> tuple[engine_host.HostRecord, LineSocket[FromHost], Welcome]:
    """A welcomed connection to the host of `slot` (started if none runs). A host that goes as
    this client arrives (it was idle, it died) is met by starting or finding the next one."""
    for attempt in range(CONNECT_TRIES):
        record = engine_host.ensure(settings, slot, start_timeout_s)
        try:
            channel: LineSocket[FromHost] = LineSocket.connect(
                Path(record.socket), FROM_HOST, f"engine host (pid {record.pid})"
            )
        except OSError as exc:
            why = f"it did not take a connection ({exc})"
        else:
            channel.send(hello)
            try:
                answer = channel.read_one(HANDSHAKE_S)
            except (OSError, ValueError) as exc:
                answer, why = None, f"the handshake broke ({type(exc).__name__}: {exc})"
            else:
                why = "it closed the connection"
            if isinstance(answer, Welcome):
                return record, channel, answer
            channel.close()
            if isinstance(answer, Turned):
                raise engine_host.HostUnavailable(
                    f"the engine host turned this client away: {answer.detail}"
                )
        log.info("engine host (pid %s): %s; trying again (%s)", record.pid, why, attempt + 1)
        engine_host.wait_gone(record)
    raise engine_host.HostUnavailable(
        f"the engine host could not be reached after {CONNECT_TRIES} tries: {why}"
    )


class EngineClient:
    def __init__(
        self,
        settings: Settings,
        client: str,
        role: Literal["server", "run", "inference", "tool"],
        slot: Slot | None = None,
        *,
        start_timeout_s: float = 120.0,
    ) -> None:
        """Connects at once to the host of `slot` (None: the machine's first), starting it if
        none runs: HostUnavailable when it cannot."""
        self._settings = settings
        self.slot = slot = slot if slot is not None else plan(settings)[0]
        self._on_tinker: Callable[[Reply], None] = lambda reply: None
        self._on_infer: Callable[[FromWorker], None] = lambda message: None
        self._on_end: Callable[[str], None] = lambda why: None
        self._asks: dict[int, Future[Status]] = {}
        self._ask_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._gone = threading.Event()
        self.record, self._channel, self.welcome = _connect(
            settings,
            slot,
            Hello(wire=WIRE, client=client, role=role, pid=os.getpid()),
            start_timeout_s,
        )

    def start(
        self,
        on_tinker: Callable[[Reply], None] = lambda reply: None,
        on_infer: Callable[[FromWorker], None] = lambda message: None,
        on_end: Callable[[str], None] = lambda why: None,
    ) -> EngineClient:
        """Hand the host's lines on from now (on a reading thread), and beat."""
        self._on_tinker, self._on_infer, self._on_end = on_tinker, on_infer, on_end
        self._channel.serve(self._take, self._end)
        threading.Thread(target=self._beat, daemon=True, name="engine beat").start()
        return self

    @property
    def pid(self) -> int:
        return self.welcome.pid

    @property
    def alive(self) -> bool:
        return not self._gone.is_set()

    def send_tinker(self, request: Op[Any]) -> bool:
        """False when the host is gone."""
        return self._channel.send(TinkerCall(request=request))  # type: ignore[arg-type]  # an Op is a Request

    def send_infer(self, message: ToWorker) -> bool:
        return self._channel.send(InferCall(message=message))

    def status(self, timeout_s: float = 10.0) -> Status:
        return self._ask(lambda ask_id: Ask(id=ask_id), timeout_s)

    def claim(self, base: str, timeout_s: float = 10.0) -> Status:
        """Count `base` against this host's room from now (this client was placed here for it);
        the host's state once it is. Call it on a started client."""
        return self._ask(lambda ask_id: Claim(id=ask_id, base=base), timeout_s)

    def _ask(self, message: Callable[[int], Ask | Claim], timeout_s: float) -> Status:
        ask_id = next(self._ask_ids)
        future: Future[Status] = Future()
        with self._lock:
            self._asks[ask_id] = future
        try:
            if not self._channel.send(message(ask_id)):
                raise engine_host.HostUnavailable("the engine host is gone")
            return future.result(timeout=timeout_s)
        finally:
            with self._lock:
                self._asks.pop(ask_id, None)

    def close(self) -> None:
        """Leave the host (what this client made there is released; the host goes on)."""
        self._gone.set()
        self._channel.close()

    def why_gone(self) -> str:
        log_path = engine_host.log_path(self._settings.var_dir, self.slot)
        tail = "\n".join(tail_lines(log_path, 10))
        return (
            f"the engine host {self.slot.name} (pid {self.pid}) exited or closed the connection. "
            f"Last lines of its log ({log_path}):\n{tail}"
        )

    def _take(self, message: FromHost) -> None:
        match message:
            case TinkerReply(reply=reply):
                self._on_tinker(reply)
            case InferReply(message=infer):
                self._on_infer(infer)
            case Status(id=ask_id):
                with self._lock:
                    future = self._asks.get(ask_id)
                if future is not None and not future.done():
                    future.set_result(message)
            case Turned(detail=detail):
                log.warning("the engine host closed this connection: %s", detail)
            case Welcome():
                pass

    def _end(self) -> None:
        was_closed = self._gone.is_set()
        self._gone.set()
        with self._lock:
            asks, self._asks = list(self._asks.values()), {}
        for future in asks:
            if not future.done():
                future.set_exception(engine_host.HostUnavailable("the engine host is gone"))
        if not was_closed:
            self._on_end(self.why_gone())

    def _beat(self) -> None:
        while not self._gone.wait(BEAT_S):
            if not self._channel.send(Beat()):
                return
