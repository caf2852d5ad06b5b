"""Test inference and chat completions as the server sends them: a chat or a warm-up to the engine
host placed for its model (server/engine/hosts.py), a test inference scored by an environment to
the inference client (client_process.py, where environment code runs). Up to MAX_IN_FLIGHT
requests at once (answers routed by request id), each with a deadline; a request whose client
went away, or whose deadline passed, is cancelled at its next decode step. The hosts are shared
with runs: a late request is given up on, never answered by restarting a host.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from core.engine_client import EngineClient
from core.infer_wire import Cancel, Done, FromWorker, Job, Partial, ToWorker
from core.pending import PendingCalls
from core.settings import Settings
from core.spec import InferenceJob, WorkerJob
from server.engine.hosts import EngineHosts
from server.engine.link import Listener
from server.errors import Unavailable
from server.inference.client_process import ClientLife, InferenceClient

log = logging.getLogger(__name__)
POLL_S = 0.2  # how often a waiting request looks at whether its client gave up

# Requests out at once: a host decodes concurrent requests on the same model as one batch (two
# /v1 clients' n=8 share each step); past this many a request waits its turn.
MAX_IN_FLIGHT = 8


class Carrier(Protocol):
    """What a request goes out on: a connection to an engine host, or a life of the inference
    client."""

    def send_infer(self, message: ToWorker) -> bool: ...

    def why_gone(self) -> str: ...


@dataclass
class _Waiting:
    carrier: Carrier  # what the request went out on
    lines: queue.Queue[FromWorker | None]  # its partial lines and answer; None: carrier gone


class InferenceWorker:
    def __init__(self, settings: Settings, hosts: EngineHosts) -> None:
        self._hosts = hosts
        self._slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self._waiting: PendingCalls[_Waiting] = PendingCalls()  # never ended: carriers come back
        self.client = InferenceClient(settings, self._route, self._ended)
        hosts.listen(Listener(on_infer=self._route, on_end=self._host_ended))

    @property
    def pid(self) -> int | None:
        """The inference client's pid while it runs."""
        return self.client.pid

    def request(
        self,
        job: WorkerJob,
        timeout_s: float,
        queue_s: float | None = None,
        abandoned: threading.Event | None = None,
        on_partial: Callable[[Partial], None] | None = None,
    ) -> dict[str, Any]:
        """Send one request and wait for its answer.

        Up to MAX_IN_FLIGHT requests are out at once; `queue_s` bounds the wait for a place
        while that many are (or while the model loads at start-up); past it the request is
        refused rather than left waiting. Once `abandoned` is set (the client went away), the
        request is stopped. `on_partial` gets its partial lines (a streamed chat's new text)."""
        if not self._slots.acquire(timeout=None if queue_s is None else max(0.0, queue_s)):
            raise Unavailable(
                f"inference is still busy after {queue_s:.0f} s (loading the model at "
                "start-up, or answering other requests); try again in a moment."
            )
        try:
            if abandoned is not None and abandoned.is_set():
                raise Unavailable("the client went away before the request was sent")
            return self._request(self._carrier(job), job, timeout_s, abandoned, on_partial)
        finally:
            self._slots.release()

    def _carrier(self, job: WorkerJob) -> Carrier:
        """Environment code to the inference client; a chat or warm-up to its model's host
        (a hosted-Tinker chat to the first host, which only relays it)."""
        if isinstance(job, InferenceJob):
            return self.client.life()
        local = job.backend == "local"
        return self._hosts.place(job.model if local else None).client()

    def _request(
        self,
        carrier: Carrier,
        job: WorkerJob,
        timeout_s: float,
        abandoned: threading.Event | None,
        on_partial: Callable[[Partial], None] | None = None,
    ) -> dict[str, Any]:
        waiting = _Waiting(carrier, queue.Queue())
        job_id = self._waiting.add(waiting)
        assert job_id is not None  # the table is never ended
        try:
            if not carrier.send_infer(Job(id=job_id, job=job)):
                raise Unavailable(carrier.why_gone())
            return _answer(carrier, job_id, waiting, timeout_s, abandoned, on_partial)
        finally:
            self._waiting.pop(job_id)

    def _route(self, carrier: Carrier, message: FromWorker) -> None:
        """On a reading thread: a line to the request it answers (a late line of a request
        given up on goes nowhere)."""
        waiting = self._waiting.get(message.id)
        if waiting is not None and waiting.carrier is carrier:
            waiting.lines.put(message)

    def _host_ended(self, client: EngineClient, _why: str) -> None:
        self._ended(client)

    def _ended(self, carrier: Carrier | ClientLife) -> None:
        """A host (or the connection to it), or the inference client, is gone: its requests
        hear it."""
        for waiting in [w for w in self._waiting.waiting() if w.carrier is carrier]:
            waiting.lines.put(None)

    def stop(self) -> None:
        """The server stops: requests still waiting give up (the hosts go on), and the
        inference client ends."""
        for entry in self._waiting.waiting():
            entry.lines.put(None)
        self.client.stop()


def _answer(
    carrier: Carrier,
    job_id: int,
    waiting: _Waiting,
    timeout_s: float,
    abandoned: threading.Event | None,
    on_partial: Callable[[Partial], None] | None,
) -> dict[str, Any]:
    """The answer to a sent job, its partial lines passed on meanwhile; the job is cancelled
    when its client goes away (it still answers) or its time is up (503)."""
    deadline = time.monotonic() + timeout_s
    cancelled = False
    while True:
        if abandoned is not None and abandoned.is_set() and not cancelled:
            cancelled = carrier.send_infer(Cancel(id=job_id))
            log.info("inference request %s cancelled: its client went away", job_id)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            carrier.send_infer(Cancel(id=job_id))
            raise Unavailable(
                f"inference did not finish within {timeout_s:.0f} s (it was cancelled); "
                "send fewer prompts or a smaller max_tokens, or raise "
                "RLCS_INFERENCE_TIMEOUT_S."
            )
        try:
            message = waiting.lines.get(timeout=min(remaining, POLL_S))
        except queue.Empty:
            continue
        match message:
            case None:
                raise Unavailable(carrier.why_gone())
            case Done(body=body):
                return body
            case Partial() if on_partial is not None:
                on_partial(message)
