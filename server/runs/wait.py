"""Waiting without polling on a run: `until=terminal` (it has finished) or `until=step:N` (it
has recorded step N, or finished), answered as soon as that holds or the timeout passes; a
sweep's wait (server/sweeps/wait.py) keeps the same bounds."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

from core.models import FINISHED, Run, RunStatus
from server.errors import InvalidValue
from server.runs.schemas import RunWaitOut
from server.runs.service import RunService

MAX_WAIT_S = 600.0  # one request holds a connection at most this long; ask again after it
POLL_S = 0.2  # a database read of one row: the answer comes within this of the event
_STEP = re.compile(r"^step:(\d{1,9})$")


@dataclass(frozen=True)
class Condition:
    step: int | None  # None: until the run has finished

    def holds(self, run: Run) -> bool:
        if RunStatus(run.status) in FINISHED:
            return True  # a finished run reaches no later step: waiting longer is pointless
        return self.step is not None and run.step >= self.step


def parse_until(until: str) -> Condition:
    if until == "terminal":
        return Condition(step=None)
    if match := _STEP.match(until):
        return Condition(step=int(match[1]))
    raise InvalidValue(
        f"until: '{until[:40]}' is not a condition; use until=terminal (the run has finished) "
        "or until=step:N (it has recorded step N)."
    )


async def wait_for_run(runs: RunService, run_id: str, until: str, timeout_s: float) -> RunWaitOut:
    """The run's detail once `until` holds, or as it is when `timeout_s` (capped) has passed,
    with `condition_met` saying which."""
    condition = parse_until(until)
    deadline = time.monotonic() + min(timeout_s, MAX_WAIT_S)
    while True:
        run = await asyncio.to_thread(runs.row, run_id)
        met = condition.holds(run)
        left = deadline - time.monotonic()
        if met or left <= 0:
            detail = await asyncio.to_thread(runs.get, run.id)
            return RunWaitOut(**detail.model_dump(), condition_met=met)
        await asyncio.sleep(min(POLL_S, left))
