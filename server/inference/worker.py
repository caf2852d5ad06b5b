"""The inference worker process as the server sees it: started at start-up (warm-up) or on
first use, kept warm, restarted if it dies, one request at a time, each with a deadline; a
request whose client went away is cancelled in the worker at its next decode step."""

from __future__ import annotations

import itertools
import json
import logging
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.settings import PROJECT_ROOT, Settings
from core.spec import WorkerJob
from server.errors import Unavailable
from server.line_pipe import died_message, end_child, read_lines, send_line

log = logging.getLogger(__name__)
WORKER_MODULE = "runners.infer"
POLL_S = 0.2  # how often a waiting request looks at whether its client gave up


class InferenceWorker:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._write_lock = threading.Lock()  # requests and cancels share the worker's stdin
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._ids = itertools.count(1)
        self._closed = False
        self.starts = 0
        self.log_path: Path = settings.var_dir / "inference.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def request(
        self,
        job: WorkerJob,
        timeout_s: float,
        queue_s: float | None = None,
        abandoned: threading.Event | None = None,
        on_partial: Callable[[dict[str, Any]], None] | None = None,
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
        on_partial: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        proc = self._ensure_started()
        request_id = next(self._ids)
        if not self._send(proc, {"id": request_id, "job": job.model_dump(mode="json")}):
            self._stop_locked()
            raise Unavailable(self._died("it exited before taking the request"))
        deadline = time.monotonic() + timeout_s
        cancelled = False
        while True:
            if abandoned is not None and abandoned.is_set() and not cancelled:
                cancelled = self._send(proc, {"cancel": request_id})
                log.info("inference request %s cancelled: its client went away", request_id)
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
                line = self._answers.get(timeout=min(remaining, POLL_S))
            except queue.Empty:
                continue
            if line is None:
                self._stop_locked()
                raise Unavailable(self._died("it exited while answering"))
            answer: dict[str, Any] = json.loads(line)  # the worker answers with JSON objects
            if answer.get("id") != request_id:
                continue  # a late line of a request that was given up on
            if not answer.get("partial"):
                return answer
            if on_partial is not None:
                on_partial(answer)

    def _send(self, proc: subprocess.Popen[str], message: dict[str, Any]) -> bool:
        with self._write_lock:
            return send_line(proc, message)

    def stop(self) -> None:
        """End the worker now, even while a request (say the warm-up) holds it: that request
        then fails at once instead of keeping the server's shutdown waiting."""
        self._closed = True
        proc = self._proc
        if proc is not None:
            end_child(proc)

    def _ensure_started(self) -> subprocess.Popen[str]:
        if self._closed:
            raise Unavailable("the server is shutting down; the inference worker is stopped.")
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        if self._proc is not None:
            log.warning("inference worker exited (%s); starting a new one", self._proc.returncode)
            end_child(self._proc)  # closes its pipes
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as log_file:
            self._proc = subprocess.Popen(
                [self._settings.python_executable, "-m", WORKER_MODULE],
                cwd=PROJECT_ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                env=self._settings.child_environment(),
                start_new_session=True,
            )
        self.starts += 1
        self._answers = read_lines(self._proc, "infer-read")
        return self._proc

    def _stop_locked(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            end_child(proc)

    def _died(self, when: str) -> str:
        return died_message("the inference worker", when, self.log_path, self._closed)
