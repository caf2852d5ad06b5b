"""One client of an engine host (the server, a run, the inference client): its handshake, then
each line it sends dispatched by its kind: Tinker operations to its own `TinkerOps`, chat jobs to
the host's inference loop, asks answered with the host's status, claims noted (a base it was
placed here for), beats noted. When the client goes (its socket closes, or it stays silent past
the timeout), everything it made goes with it. A connection whose first line is an `Ask` is a
probe: answered, then closed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from pydantic import BaseModel, ValidationError

from core.engine_wire import (
    WIRE,
    Ask,
    Beat,
    Claim,
    ClientSeen,
    Hello,
    InferCall,
    InferReply,
    Status,
    TinkerCall,
    TinkerReply,
    ToHost,
    Turned,
    Welcome,
)
from core.line_socket import LineSocket
from runners.engine.local import LocalServiceClient
from runners.engine_host.inference import InferenceLoop
from runners.engine_host.tinker_ops import TinkerOps

log = logging.getLogger("engine-host")
HELLO_TIMEOUT_S = 10.0
CLAIM_TTL_S = 600.0  # a claim whose base never loaded here stops counting after this long


class Connection:
    def __init__(
        self,
        channel: LineSocket[ToHost],
        service: LocalServiceClient,
        inference: InferenceLoop,
        status: Callable[[int], Status],
        on_end: Callable[[Connection], None],
        welcome: Welcome,
    ) -> None:
        self.channel = channel
        self._inference = inference
        self._status = status
        self._on_end = on_end
        self._welcome = welcome
        self.hello: Hello | None = None
        self.connected_at = time.time()
        self.last_seen = time.monotonic()
        self.tinker = TinkerOps(service, self._send_tinker)
        self._ended = threading.Event()
        self._claims: dict[str, float] = {}  # base -> when claimed (time.monotonic())
        self._claims_lock = threading.Lock()

    def start(self) -> bool:
        """Read the client's Hello and answer it; then serve its lines on a thread. False
        (the connection closed) for a client that does not speak this wire."""
        try:
            first = self.channel.read_one(HELLO_TIMEOUT_S)
        except (OSError, ValueError, ValidationError) as exc:
            self._turn(f"the first line must be a hello on wire {WIRE} ({type(exc).__name__})")
            return False
        if first is None:
            self.channel.close()  # closed without a word: someone looking whether we listen
            return False
        if isinstance(first, Ask):  # a probe (core/engine_placement.py): the state, no client
            self.channel.send(self._status(first.id))
            self.channel.close()
            return False
        if not isinstance(first, Hello):
            self._turn(f"the first line must be a hello on wire {WIRE}")
            return False
        if first.wire != WIRE:
            self._turn(
                f"wire: this engine host speaks wire {WIRE}, the client {first.client} speaks "
                f"{first.wire}; restart the client (or the host) from the same tree"
            )
            return False
        self.hello = first
        self.channel.send(self._welcome)
        log.info("client %s (%s, pid %s) connected", first.client, first.role, first.pid)
        self.channel.serve(self._take, self._end, self._not_a_line)
        return True

    @property
    def name(self) -> str:
        return self.hello.client if self.hello is not None else "a client"

    def seen(self) -> ClientSeen:
        assert self.hello is not None
        models, samplers = self.tinker.counts()
        return ClientSeen(
            client=self.hello.client,
            role=self.hello.role,
            pid=self.hello.pid,
            connected_at=self.connected_at,
            seconds_silent=round(time.monotonic() - self.last_seen, 1),
            models=models,
            samplers=samplers,
            bases=self.tinker.bases(),
            jobs=self._inference.jobs_of(self),
        )

    def claims(self, loaded: set[str]) -> list[str]:
        """The bases this client claimed that still count: not loaded yet (a loaded one counts
        for itself) and claimed within CLAIM_TTL_S."""
        now = time.monotonic()
        with self._claims_lock:
            for base, since in list(self._claims.items()):
                if base in loaded or now - since > CLAIM_TTL_S:
                    del self._claims[base]
            return list(self._claims)

    def close(self) -> None:
        """Cut the client off (silent too long, or the host is ending): its end follows."""
        self.channel.close()

    def _take(self, message: ToHost) -> None:
        self.last_seen = time.monotonic()
        match message:
            case TinkerCall(request=request):
                self.tinker.handle(request)
            case InferCall(message=job):
                self._inference.take(self, job)
            case Ask(id=ask_id):
                self.channel.send(self._status(ask_id))
            case Claim(id=ask_id, base=base):
                with self._claims_lock:
                    self._claims[base] = time.monotonic()
                self.channel.send(self._status(ask_id))
            case Beat():
                pass
            case Hello():
                log.warning("%s said hello twice; ignored", self.name)

    def _not_a_line(self, line: str, error: ValidationError) -> None:
        """A Tinker request this host does not know (a newer client's operation, a field it
        lacks) is refused by its id, so its POST answers at once; anything else is logged."""
        try:
            message = json.loads(line)
            inner = message.get("request") if message.get("kind") == "tinker" else None
        except (ValueError, AttributeError):
            inner = None
        if isinstance(inner, dict):
            self.tinker.refuse_line(json.dumps(inner), error)
            return
        log.warning("%s sent a line that is not the engine wire: %.200s", self.name, line)

    def _send_tinker(self, reply: BaseModel) -> None:
        self.channel.send(TinkerReply(reply=reply))  # type: ignore[arg-type]  # always a Reply

    def send_infer(self, message: InferReply) -> None:
        self.channel.send(message)

    def _end(self) -> None:
        if self._ended.is_set():
            return
        self._ended.set()
        log.info("client %s is gone: releasing what it held", self.name)
        try:
            self._inference.cancel_all(self)
            self.tinker.release_everything()
        except Exception:  # the host must forget the client whatever went wrong here
            log.exception("releasing what %s held failed", self.name)
        finally:
            self.channel.close()
            self._on_end(self)

    def _turn(self, detail: str) -> None:
        log.warning("turned a client away: %s", detail)
        self.channel.send(Turned(detail=detail))
        self.channel.close()
