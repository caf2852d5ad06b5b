"""Where an Atropos run's batches come from, once started (runners/atropos/trainer.py): the
trajectory API and the environment beside the runner, the inference face they sample from, and
the watches on the environment's log, W&B metrics and evaluations. `next_batch` waits for a
batch while watching them: a child that ends, an environment that hangs, a stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from core.failures import RunFailure
from core.process import Process
from core.settings import Settings
from runners.atropos.watch import EvalWatch, LogWatch, MetricsTap
from runners.doors.face import InferenceFace

log = logging.getLogger("runner")
BATCH_POLL_S = 0.2  # how often an empty trajectory API is asked again
ENV_DONE_GRACE_S = 2.0  # after the environment's exit 0, how long its queue may give nothing


class EnvironmentFailed(RunFailure):
    """The environment (or the trajectory API) ended or hung while the run needed it."""

    category = "environment"


class Stalled(RunFailure):
    """No usable batch came for RLCS_ATROPOS_STALL_S; the message says why, from its log."""

    category = "stalled"


@dataclass
class Environment:
    """The environment's process, once started, and the watches on what it writes."""

    process: Process
    started_at: float  # time.monotonic()
    log_watch: LogWatch
    tap: MetricsTap
    evals: EvalWatch


@dataclass
class Feed:
    settings: Settings
    total_steps: int
    face: InferenceFace
    context: int | None  # the model's context on the local backend (None: not known here)
    http: httpx.AsyncClient
    api: Process
    api_url: str
    env: Environment
    note_stall: Callable[[str | None], None]  # the run's details: a stall, or None once over
    stall_noted: bool = False
    env_done_at: float | None = None  # when its exit (0) was first seen

    async def next_batch(self, step: int) -> list[dict[str, Any]]:
        """The next batch of scored groups; the environment's and the API's health watched
        meanwhile, and a wait with no batch (once the environment works) reported as a
        stall, then failed."""
        waiting_since = time.monotonic()
        stall_s = self.settings.atropos_stall_s
        notice_s = min(60.0, stall_s / 3)
        while True:
            batch = await self._batch()
            if batch:
                if self.stall_noted:
                    self.note_stall(None)
                    self.stall_noted = False
                return batch
            await self._check_children(step)
            working_since = self._working_since()
            if working_since is not None:
                waited = time.monotonic() - max(waiting_since, working_since)
                if waited > notice_s and not self.stall_noted:
                    self.note_stall("stalled: " + self._stall(step, waited))
                    self.stall_noted = True
                if waited > stall_s:
                    raise Stalled(self._stall(step, waited) + " (RLCS_ATROPOS_STALL_S)")
            await asyncio.sleep(BATCH_POLL_S)

    async def queue_size(self) -> int:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            answer = await self.http.get(f"{self.api_url}/status", timeout=5)
            return int(answer.json().get("queue_size", 0))
        return 0

    async def stop_children(self) -> None:
        """The environment, then the API (their exits are what the run ends with, too)."""
        for child in (self.env.process, self.api):
            await asyncio.to_thread(child.stop)

    # Watching ------------------------------------------------------------------------------

    def _stall(self, step: int, waited: float) -> str:
        return (
            f"no usable batch from the environment for {waited:.0f} s (step {step}): "
            f"{self._evidence(self.env.log_watch.why_nothing())}"
        )

    def _evidence(self, why: str) -> str:
        """`why`, and what the face refused the environment meanwhile (a prompt beyond the
        model's context, say)."""
        stats = self.face.stats
        if stats.refused:
            why += (
                f"; the inference face refused {stats.refused} request(s), the last "
                f"{stats.last_refusal}"
            )
        return why

    async def _batch(self) -> list[dict[str, Any]] | None:
        try:
            answer = await self.http.get(f"{self.api_url}/batch")
            answer.raise_for_status()
            return answer.json().get("batch") or None
        except (httpx.HTTPError, ValueError) as exc:
            if self.api.exit_code() is not None:
                raise EnvironmentFailed(
                    f"the trajectory API ended while the run needed data: {self.api.describe()}"
                ) from None
            log.warning("the trajectory API did not answer /batch: %s", exc)
            return None

    async def _check_children(self, step: int) -> None:
        if self.api.exit_code() is not None:
            raise EnvironmentFailed(
                f"the trajectory API ended while the run needed data for step {step}: "
                f"{self.api.describe()}"
            )
        code = self.env.process.exit_code()
        if code is None:
            return
        if code != 0:
            raise EnvironmentFailed(
                f"the environment ended while the run needed data for step {step}: "
                f"{self.env.process.describe()}"
            )
        # Exit 0: it stops once it has queued enough for total_steps, and what it queued
        # comes out of the API. A queue that gives no batch a moment later holds too little.
        now = time.monotonic()
        if self.env_done_at is None:
            self.env_done_at = now
        elif now - self.env_done_at > ENV_DONE_GRACE_S:
            raise EnvironmentFailed(
                f"the environment exited (0) without queueing enough for step {step} of "
                f"{self.total_steps} ({await self.queue_size()} group(s) left in the queue): "
                f"{self.env.process.describe()}"
            )

    def _working_since(self) -> float | None:
        """When the environment asked for its first completion (None: not yet, and it fails
        once it has not for RLCS_ATROPOS_START_TIMEOUT_S: it hangs in its setup)."""
        first = self.face.stats.first_request_at
        if first is not None:
            return first
        limit = self.settings.atropos_start_timeout_s
        if time.monotonic() - self.env.started_at > limit:
            self.env.log_watch.read()
            why = (
                self.env.log_watch.why_nothing()
                if self.env.log_watch.total
                else "it hangs in its setup or its first item"
            )
            raise EnvironmentFailed(
                f"the environment asked for no completion within {limit:g} s of its start "
                f"(RLCS_ATROPOS_START_TIMEOUT_S): {self._evidence(why)}; "
                f"{self.env.process.describe()}"
            )
        return None
