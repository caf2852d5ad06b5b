"""Upload finished episodes to OpenReward (client.rollout) from a daemon thread: the SDK's
rollout.create blocks on a request, and a slow or unreachable API must never hold up training."""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Transcript:
    """One episode as OpenReward's upload messages, each with its reward and finished flag."""

    run_name: str
    environment: str
    split: str
    task_index: int
    events: list[tuple[Any, float | None, bool]] = field(default_factory=list)


_jobs: queue.Queue[tuple[str, Transcript]] = queue.Queue(maxsize=10_000)
_started = threading.Event()
_start_lock = threading.Lock()


def submit(api_key: str, transcript: Transcript) -> None:
    """Queue an upload; dropped (with a warning) if the queue is full."""
    _ensure_worker()
    try:
        _jobs.put_nowait((api_key, transcript))
    except queue.Full:
        log.warning("OpenReward upload queue is full; dropping a rollout")


def wait_idle(timeout: float) -> bool:
    """Block until every queued upload was handed to the SDK (tests and shutdown)."""
    done = threading.Event()

    def _check() -> None:
        _jobs.join()
        done.set()

    threading.Thread(target=_check, daemon=True).start()
    return done.wait(timeout)


def _ensure_worker() -> None:
    with _start_lock:
        if not _started.is_set():
            threading.Thread(target=_work, name="openreward-upload", daemon=True).start()
            _started.set()


def _work() -> None:
    while True:
        api_key, transcript = _jobs.get()
        try:
            _upload(api_key, transcript)
        except Exception as exc:  # an upload failure must never reach the training loop
            log.warning("OpenReward rollout upload failed: %s", exc)
        finally:
            _jobs.task_done()


def _upload(api_key: str, transcript: Transcript) -> None:
    rollout = _client(api_key).rollout.create(
        run_name=transcript.run_name,
        environment=transcript.environment,
        split=transcript.split,
        metadata={"task_index": transcript.task_index},
    )
    for message, reward, finished in transcript.events:
        rollout.log(message, reward=reward, is_finished=finished)


@lru_cache(maxsize=4)
def _client(api_key: str) -> Any:
    from environments.support.openreward_client import make_client

    return make_client(api_key)
