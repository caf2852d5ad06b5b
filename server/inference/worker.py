"""The inference worker process as the server sees it: started at start-up (warm-up) or on
first use, kept warm, restarted if it dies, one request at a time, each with a deadline; a
request whose client went away is cancelled in the worker at its next decode step."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
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


class InferenceWorker:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
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

        `queue_s` bounds the wait for the worker while it serves another request (or loads
        the model at start-up); past it the request is refused rather than left waiting.
        Once `abandoned` is set (the client went away), the worker is told to stop it.
        `on_partial` gets the request's partial lines (a streamed chat's new text)."""
        if not self._lock.acquire(timeout=-1 if queue_s is None else max(0.0, queue_s)):
            raise Unavailable(
                f"the inference worker is still busy after {queue_s:.0f} s (loading the model "
                "at start-up, or answering another request); try again in a moment."
            )
        try:
            if abandoned is not None and abandoned.is_set():
                raise Unavailable("the client went away before the request was sent")
            return self._request_locked(job, timeout_s, abandoned, on_partial)
        finally:
            self._lock.release()

    def _request_locked(
        self,
        job: WorkerJob,
        timeout_s: float,
        abandoned: threading.Event | None,
        on_partial: Callable[[Partial], None] | None = None,
    ) -> dict[str, Any]:
        child = self._ensure_started()
        job_id = next(self._ids)
        if not child.send(Job(id=job_id, job=job)):
            self._stop_locked()
            raise Unavailable(self._died(child, "it exited before taking the request"))
        deadline = time.monotonic() + timeout_s
        cancelled = False
        while True:
            if abandoned is not None and abandoned.is_set() and not cancelled:
                cancelled = child.send(Cancel(id=job_id))
                log.info("inference request %s cancelled: its client went away", job_id)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # A stuck model must not hold the next request hostage.
                self._stop_locked()
                raise Unavailable(
                    f"inference did not finish within {timeout_s:.0f} s (the worker was "
                    "restarted); send fewer prompts or a smaller max_tokens, or raise "
                    "RLCS_INFERENCE_TIMEOUT_S."
                )
            try:
                message = child.receive(timeout=min(remaining, POLL_S))
            except TimeoutError:
                continue
            match message:
                case None:
                    self._stop_locked()
                    raise Unavailable(self._died(child, "it exited while answering"))
                case Done(id=answered, body=body) if answered == job_id:
                    return body
                case Partial(id=answered) if answered == job_id and on_partial is not None:
                    on_partial(message)
                case _:
                    continue  # a late line of a request that was given up on

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
        self._child = Child(
            "the inference worker",
            [self._settings.python_executable, "-m", WORKER_MODULE],
            FROM_WORKER,
            cwd=PROJECT_ROOT,
            env=self._settings.child_environment(),
            log_path=self.log_path,
        )
        self.starts += 1
        return self._child

    def _stop_locked(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.stop()

    def _died(self, child: Child[FromWorker], when: str) -> str:
        if self._closed:
            return "the server is shutting down; the inference worker was stopped"
        return child.failure(when)
