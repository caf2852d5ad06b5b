"""The Tinker API's side of the engine hosts (server/engine/hosts.py: the server's connection to
each, a host started on first use and outliving the server). A session is placed on one host at
its first model or sampler (`place`) and sends every request there.

Each request (core.tinker_wire) gets an acknowledgement, awaited by the POST that sent it, and
once accepted its answer later, handed to the request's `on_answer` on the event loop; if the
host (or the connection to it) goes first, `on_answer` gets a `Failed` (category server) in its
place, and `on_exit` hears which host and why: the models of its sessions went with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.engine_client import EngineClient
from core.pending import PendingCalls
from core.tinker_wire import Accepted, Answer, Done, Failed, Op, Refused, Reply
from server.engine.hosts import EngineHosts
from server.engine.link import Listener
from server.errors import Unavailable

log = logging.getLogger(__name__)
OnAnswer = Callable[[Answer, float], None]  # the answer, and how long it ran (s)
ACK_TIMEOUT_S = 300.0  # a first request waits for the host to start (imports, a model load)


@dataclass(frozen=True)
class Refusal:
    """The host would not take a request: the HTTP status and why."""

    status: int
    detail: str


@dataclass(frozen=True)
class _Call:
    """A request a connection to the host owes an acknowledgement, then maybe an answer."""

    ack: asyncio.Future[Refusal | None]
    on_answer: OnAnswer | None


class EngineTinker:
    def __init__(self, hosts: EngineHosts, on_exit: Callable[[int, str], None]) -> None:
        self._hosts = hosts
        self._on_exit = on_exit  # told (on the event loop) which host died, and why
        self._pending: dict[int, PendingCalls[_Call]] = {}  # by id() of the connection
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        hosts.listen(
            Listener(
                on_tinker=lambda client, reply: self._hand_over(self._dispatch, client, reply),
                on_end=lambda client, why: self._hand_over(self._exited, client, why),
            )
        )

    def alive(self, host: int | None) -> bool:
        """Whether the server is connected to host `host` (its sessions' models are there)."""
        return host is not None and self._hosts.links[host].pid is not None

    def log_path(self, host: int) -> Path:
        return self._hosts.links[host].log_path

    async def place(self, base: str | None) -> int:
        """The host a new session on `base` goes to (connected: it may start the host)."""
        self._loop = asyncio.get_running_loop()
        if self._closed:
            raise Unavailable("the server is shutting down")
        link = await asyncio.to_thread(self._hosts.place, base)
        return link.slot.index

    async def call(self, request: Op[Any], on_answer: OnAnswer | None, host: int) -> Refusal | None:
        """Send one request to host `host`; once acknowledged, None or why it was refused.
        `on_answer` gets its answer later (a refused request has none)."""
        self._loop = asyncio.get_running_loop()
        if self._closed:
            raise Unavailable("the server is shutting down")
        link = self._hosts.links[host]
        client = await asyncio.to_thread(link.client)  # may start the host: seconds
        pending = self._pending.setdefault(id(client), PendingCalls())
        ack: asyncio.Future[Refusal | None] = self._loop.create_future()
        request_id = pending.add(_Call(ack, on_answer))  # before sending: it may come back at once
        if request_id is None:  # the connection ended meanwhile
            raise Unavailable(client.why_gone())
        try:
            # A large body may fill the socket until the host reads it: not on the event loop.
            sent = request.model_copy(update={"id": request_id})
            if not await asyncio.to_thread(client.send_tinker, sent):
                raise Unavailable(client.why_gone())
            refusal = await asyncio.wait_for(asyncio.shield(ack), ACK_TIMEOUT_S)
        except TimeoutError:
            pending.pop(request_id)
            raise Unavailable(
                f"the engine host {link.slot.name} did not take the request within "
                f"{ACK_TIMEOUT_S:.0f} s; see {link.log_path}"
            ) from None
        except BaseException:
            pending.pop(request_id)
            raise
        if refusal is not None or on_answer is None:
            pending.pop(request_id)  # no answer to wait for
        return refusal

    def stop(self) -> None:
        """The server stops: requests still owed an answer will not get one from here."""
        self._closed = True

    def _hand_over(self, fn: Callable[..., None], *args: Any) -> None:
        """From the connection's reading thread to the event loop, in order."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed meanwhile (server shutdown)
                pass

    def _dispatch(self, client: EngineClient, reply: Reply) -> None:
        pending = self._pending.get(id(client))
        if pending is None:
            return
        match reply:
            case Accepted(id=request_id):
                _settle(pending.get(request_id), None)
            case Refused(id=request_id, status=status, detail=detail) if request_id is not None:
                _settle(pending.get(request_id), Refusal(status, detail))
            case Done(id=request_id, answer=answer, run_s=run_s):
                call = pending.pop(request_id)
                if call is not None and call.on_answer is not None:
                    call.on_answer(answer, run_s)
            case Refused(detail=detail):
                log.warning("the engine host refused a line that was not a request: %s", detail)

    def _exited(self, client: EngineClient, why: str) -> None:
        pending = self._pending.pop(id(client), None)
        if pending is None:
            return  # this connection never carried a Tinker request
        if self._closed:
            why = "the server is shutting down"
        calls = pending.end(why)
        for call in calls:
            _settle(call, Refusal(503, why))
        for call in calls:
            if call.on_answer is not None:
                call.on_answer(Failed(error=why, category="server"), 0.0)
        self._on_exit(client.slot.index, why)


def _settle(call: _Call | None, refusal: Refusal | None) -> None:
    """A call's acknowledgement (None: taken), unless it had one already."""
    if call is not None and not call.ack.done():
        call.ack.set_result(refusal)
