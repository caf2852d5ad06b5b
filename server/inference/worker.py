"""The inference worker process as the server sees it: started at start-up (warm-up) or on
first use, kept warm, restarted if it dies; up to MAX_IN_FLIGHT requests in it at once (its
answers routed by request id), each with a deadline; a request whose client went away is
cancelled in the worker at its next decode step."""

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

from core.child import Child
from core.infer_wire import FROM_WORKER, Cancel, Done, FromWorker, Job, Partial
from core.settings import PROJECT_ROOT, Settings
from core.spec import WorkerJob
from server.errors import Unavailable

log = logging.getLogger(__name__)
WORKER_MODULE = "runners.infer"
POLL_S = 0.2  # how often a waiting request looks at whether its client gave up


# Requests in the worker at once: its engine decodes concurrent requests on the same model as
# one batch (two /v1 clients' n=8 share each step); past this many a request waits its turn.
MAX_IN_FLIGHT = 8


@dataclass
class _Waiting:
    child: Child[FromWorker]  # the worker process the request was sent to
    lines: queue.Queue[FromWorker | None]  # its partial lines and answer; None: that worker ended


class InferenceWorker:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()  # the worker's start and stop, and the waiting table
        self._slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self._waiting: dict[int, _Waiting] = {}
        self._child: Child[FromWorker] | None = None
        self._ids = itertools.count(1)
        self._closed = False
        self.starts = 0
        self.log_path: Path = settings.var_dir / "inference.log"

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.pid if child is not None and child.alive else None

    def request(
        self,
        job: WorkerJob,
        timeout_s: float,
        queue_s: float | None = None,
        abandoned: threading.Event | None = None,
        on_partial: Callable[[Partial], None] | None = None,
    ) -> dict[str, Any]:
        """Send one request and wait for its answer; a missed deadline restarts the worker.

        Up to MAX_IN_FLIGHT requests are in the worker at once; `queue_s` bounds the wait for
        a place while that many are (or while the model loads at start-up); past it the
        request is refused rather than left waiting. Once `abandoned` is set (the client went
        away), the worker is told to stop it. `on_partial` gets the request's partial lines
        (a streamed chat's new text)."""
        if not self._slots.acquire(timeout=None if queue_s is None else max(0.0, queue_s)):
            raise Unavailable(
                f"the inference worker is still busy after {queue_s:.0f} s (loading the model "
                "at start-up, or answering other requests); try again in a moment."
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
        with self._lock:
            child = self._ensure_started()
            job_id = next(self._ids)
            waiting = _Waiting(child, queue.Queue())
            self._waiting[job_id] = waiting
        try:
            if not child.send(Job(id=job_id, job=job)):
                self._stop(child)
                raise Unavailable(self._died(child, "it exited before taking the request"))
            deadline = time.monotonic() + timeout_s
            cancelled = False
            while True:
                if abandoned is not None and abandoned.is_set() and not cancelled:
                    cancelled = child.send(Cancel(id=job_id))
                    log.info("inference request %s cancelled: its client went away", job_id)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # A stuck model must not hold the next requests hostage.
                    self._stop(child)
                    raise Unavailable(
                        f"inference did not finish within {timeout_s:.0f} s (the worker was "
                        "restarted); send fewer prompts or a smaller max_tokens, or raise "
                        "RLCS_INFERENCE_TIMEOUT_S."
                    )
                try:
                    message = waiting.lines.get(timeout=min(remaining, POLL_S))
                except queue.Empty:
                    continue
                match message:
                    case None:
                        self._stop(child)
                        raise Unavailable(self._died(child, "it exited while answering"))
                    case Done(body=body):
                        return body
                    case Partial() if on_partial is not None:
                        on_partial(message)
        finally:
            with self._lock:
                self._waiting.pop(job_id, None)

    def _route(self, child: Child[FromWorker], message: FromWorker) -> None:
        """On the worker's reading thread: a line to the request it answers (a late line of
        a request given up on, or an answer to a line that was no job, goes nowhere)."""
        with self._lock:
            waiting = self._waiting.get(message.id) if message.id is not None else None
        if waiting is not None and waiting.child is child:
            waiting.lines.put(message)

    def _ended(self, child: Child[FromWorker]) -> None:
        """On the reading thread, once the worker's output ended: its requests hear it."""
        with self._lock:
            mine = [w for w in self._waiting.values() if w.child is child]
        for waiting in mine:
            waiting.lines.put(None)

    def stop(self) -> None:
        """End the worker now, even while a request (say the warm-up) holds it: that request
        then fails at once instead of keeping the server's shutdown waiting."""
        self._closed = True
        child = self._child
        if child is not None:
            child.stop()

    def _ensure_started(self) -> Child[FromWorker]:
        if self._closed:
            raise Unavailable("the server is shutting down; the inference worker is stopped.")
        child = self._child
        if child is not None and child.alive:
            return child
        if child is not None:
            log.warning("inference worker exited (%s); starting a new one", child.exit_status())
            child.stop()  # closes its pipes
        started: Child[FromWorker] = Child(
            "the inference worker",
            [self._settings.python_executable, "-m", WORKER_MODULE],
            FROM_WORKER,
            cwd=PROJECT_ROOT,
            env=self._settings.child_environment(),
            log_path=self.log_path,
            on_message=lambda message: self._route(started, message),
            on_end=lambda _code: self._ended(started),
        )
        self._child = started
        self.starts += 1
        return started

    def _stop(self, child: Child[FromWorker]) -> None:
        """End `child` (its other requests hear that it ended); the next request starts
        another."""
        with self._lock:
            if self._child is child:
                self._child = None
        child.stop()

    def _died(self, child: Child[FromWorker], when: str) -> str:
        if self._closed:
            return "the server is shutting down; the inference worker was stopped"
        return child.failure(when)
