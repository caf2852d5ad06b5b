"""Test inference and chat completions as the server sends them to the engine host (its one
connection, server/engine/link.py): up to MAX_IN_FLIGHT requests at once (answers routed by
request id), each with a deadline; a request whose client went away, or whose deadline passed,
is cancelled in the host at its next decode step. The host is shared with runs: a late request
is given up on, never answered by restarting the host.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import engine_host
from core.engine_client import EngineClient
from core.infer_wire import Cancel, Done, FromWorker, Job, Partial
from core.spec import WorkerJob
from server.engine.link import EngineLink, Listener
from server.errors import Unavailable

log = logging.getLogger(__name__)
POLL_S = 0.2  # how often a waiting request looks at whether its client gave up

# Requests in the host at once: its engine decodes concurrent requests on the same model as
# one batch (two /v1 clients' n=8 share each step); past this many a request waits its turn.
MAX_IN_FLIGHT = 8


@dataclass
class _Waiting:
    client: EngineClient  # the connection the request went out on
    lines: queue.Queue[FromWorker | None]  # its partial lines and answer; None: host gone


class InferenceWorker:
    def __init__(self, link: EngineLink) -> None:
        self._link = link
        self._lock = threading.Lock()  # the waiting table
        self._slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self._waiting: dict[int, _Waiting] = {}
        self._ids = itertools.count(1)
        self.log_path: Path = engine_host.folder(link.var_dir) / engine_host.LOG
        link.listen(Listener(on_infer=self._route, on_end=self._ended))

    @property
    def pid(self) -> int | None:
        return self._link.pid

    @property
    def starts(self) -> int:
        return self._link.connects

    def request(
        self,
        job: WorkerJob,
        timeout_s: float,
        queue_s: float | None = None,
        abandoned: threading.Event | None = None,
        on_partial: Callable[[Partial], None] | None = None,
    ) -> dict[str, Any]:
        """Send one request and wait for its answer.

        Up to MAX_IN_FLIGHT requests are in the host at once; `queue_s` bounds the wait for
        a place while that many are (or while the model loads at start-up); past it the
        request is refused rather than left waiting. Once `abandoned` is set (the client went
        away), the host is told to stop it. `on_partial` gets the request's partial lines
        (a streamed chat's new text)."""
        if not self._slots.acquire(timeout=None if queue_s is None else max(0.0, queue_s)):
            raise Unavailable(
                f"inference is still busy after {queue_s:.0f} s (loading the model at "
                "start-up, or answering other requests); try again in a moment."
            )
        try:
            if abandoned is not None and abandoned.is_set():
                raise Unavailable("the client went away before the request was sent")
            return self._request(job, timeout_s, abandoned, on_partial)
        finally:
            self._slots.release()

    def _request(
        self,
        job: WorkerJob,
        timeout_s: float,
        abandoned: threading.Event | None,
        on_partial: Callable[[Partial], None] | None = None,
    ) -> dict[str, Any]:
        client = self._link.client()
        job_id = next(self._ids)
        waiting = _Waiting(client, queue.Queue())
        with self._lock:
            self._waiting[job_id] = waiting
        try:
            if not client.send_infer(Job(id=job_id, job=job)):
                raise Unavailable(client.why_gone())
            deadline = time.monotonic() + timeout_s
            cancelled = False
            while True:
                if abandoned is not None and abandoned.is_set() and not cancelled:
                    cancelled = client.send_infer(Cancel(id=job_id))
                    log.info("inference request %s cancelled: its client went away", job_id)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    client.send_infer(Cancel(id=job_id))
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
                        raise Unavailable(client.why_gone())
                    case Done(body=body):
                        return body
                    case Partial() if on_partial is not None:
                        on_partial(message)
        finally:
            with self._lock:
                self._waiting.pop(job_id, None)

    def _route(self, client: EngineClient, message: FromWorker) -> None:
        """On the connection's reading thread: a line to the request it answers (a late line
        of a request given up on goes nowhere)."""
        with self._lock:
            waiting = self._waiting.get(message.id) if message.id is not None else None
        if waiting is not None and waiting.client is client:
            waiting.lines.put(message)

    def _ended(self, client: EngineClient, _why: str) -> None:
        """The host (or the connection) is gone: its requests hear it."""
        with self._lock:
            mine = [w for w in self._waiting.values() if w.client is client]
        for waiting in mine:
            waiting.lines.put(None)

    def stop(self) -> None:
        """The server stops: requests still waiting give up (the host goes on)."""
        with self._lock:
            waiting = list(self._waiting.values())
        for entry in waiting:
            entry.lines.put(None)
