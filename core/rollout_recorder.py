"""Recording a run's rollouts off its training path (DESIGN §14): a step's records are picked
at once and written by a thread of their own, one transaction per step (then handed to
`on_written`: the runner's W&B table). Recording never fails or holds up the run: a write that
fails (a full disk, a database error) stops the record, and says so in the log, the step's
metrics (`rollouts/stopped`) and, where it can, the record."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from core import rollout_store
from core.rollouts import Picked, RolloutRecord, pick

log = logging.getLogger(__name__)
# Steps waiting to be written; past it a step is skipped rather than the run waiting.
QUEUE_STEPS = 8
CLOSE_TIMEOUT_S = 30.0
Kept = list[tuple[RolloutRecord, Picked]]


@dataclass
class _Job:
    step: int
    picked: Kept
    sampled: list[RolloutRecord]
    metrics: dict[str, float] | None


class RolloutRecorder:
    """A run's record of what its steps sampled: `record` each step, `close` at the end."""

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        *,
        per_step: int,
        max_bytes: int,
        seed: int,
        say: Callable[[str], None] | None = None,
        on_written: Callable[[int, Kept], None] | None = None,
    ) -> None:
        self._engine = engine
        self.run_id = run_id
        self.per_step = per_step
        self.max_bytes = max_bytes
        self._seed = seed
        self._say = say or _print_line
        self._on_written = on_written
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=QUEUE_STEPS)
        self._thread: threading.Thread | None = None
        self.stopped: str | None = None  # why the record stopped
        self.skipped = 0  # steps not recorded because the writer was behind
        # The last step queued and the last one the writer is done with (written, failed or
        # passed over), for `wait_for`.
        self._queued = 0
        self._handled = 0
        self._progress = threading.Condition()

    def record(
        self,
        step: int,
        records: list[RolloutRecord],
        metrics: dict[str, float] | None = None,
    ) -> Kept:
        """Pick what the step keeps and queue it to be written; what it keeps. Never blocks
        and never raises."""
        if self.per_step <= 0 or self.stopped is not None:
            return []
        picked = pick(records, self.per_step, self._seed * 1_000_003 + step)
        try:
            self._queue.put_nowait(_Job(step, picked, records, metrics))
            self._queued = step
        except queue.Full:
            self.skipped += 1
            self._tell(f"rollouts of step {step} not recorded: the writer is behind")
            return picked
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="rollouts", daemon=True)
            self._thread.start()
        return picked

    def metrics(self) -> dict[str, float]:
        """What a step's metrics say of the record: nothing while all is well."""
        out = {"rollouts/stopped": 1.0} if self.stopped is not None else {}
        if self.skipped:
            out["rollouts/skipped_steps"] = float(self.skipped)
        return out

    def wait_for(self, step: int, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until the writer is done with every queued step up to
        `step`, its `on_written` included; whether it is."""
        with self._progress:
            return self._progress.wait_for(
                lambda: self._handled >= min(step, self._queued) or self._thread is None,
                timeout_s,
            )

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is queued, waiting at most `timeout_s` (a hung database must not hold
        the run's end)."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._tell(f"rollouts still being written after {timeout_s:g} s were left unwritten")
        with self._progress:
            self._thread = None
            self._progress.notify_all()

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            self._handle(job)
            with self._progress:
                self._handled = job.step
                self._progress.notify_all()

    def _handle(self, job: _Job) -> None:
        """Write one step, then hand it to `on_written`; a failure stops the record."""
        if self.stopped is not None:
            return
        try:
            written = rollout_store.write_step(
                self._engine,
                self.run_id,
                job.step,
                job.picked,
                sampled=job.sampled,
                max_bytes=self.max_bytes,
                metrics=job.metrics,
            )
        except Exception as exc:  # a full disk, a database error: the record stops, not the run
            self._stop(job.step, exc)
            return
        if written.thinned_steps:
            log.info(
                "rollouts: steps %s thinned to keep the run under %s MB",
                written.thinned_steps,
                self.max_bytes / 1e6,
            )
        if self._on_written is not None and job.picked:
            try:
                self._on_written(job.step, job.picked)
            except Exception as exc:  # a mirror of the record (W&B): never stops it
                log.warning("rollouts of step %s: %s", job.step, exc)

    def _stop(self, step: int, exc: Exception) -> None:
        # A database error's own words (SQLAlchemy's text goes on with the statement).
        cause = getattr(exc, "orig", None) or exc
        why = (str(cause).splitlines() or [""])[0][:300]
        self.stopped = (
            f"rollouts are not recorded from step {step} on: writing them failed "
            f"({type(cause).__name__}: {why}); the run goes on"
        )
        self._tell(self.stopped)
        try:  # where the database still takes a small write, the record says so too
            rollout_store.note_step(self._engine, self.run_id, step, self.stopped)
        except Exception:
            pass

    def _tell(self, line: str) -> None:
        try:  # the log may be on the full disk too
            self._say(line)
        except Exception:
            pass


def _print_line(line: str) -> None:
    print(line, flush=True)  # a runner's stdout is its log
