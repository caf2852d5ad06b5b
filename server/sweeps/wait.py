"""Waiting without polling on a sweep: until all its runs have finished, answered as soon as
that holds or the timeout passes (the bounds of a run's wait, server/runs/wait.py)."""

from __future__ import annotations

import asyncio
import time

from core.models import FINISHED, RunStatus
from server.runs.wait import MAX_WAIT_S, POLL_S
from server.sweeps.schemas import SweepWaitOut
from server.sweeps.service import SweepService


async def wait_for_sweep(sweeps: SweepService, sweep_id: str, timeout_s: float) -> SweepWaitOut:
    """The sweep's results once every run has finished, or as they are at the timeout."""
    deadline = time.monotonic() + min(timeout_s, MAX_WAIT_S)
    sweeps.row(sweep_id)  # 404/422 at once
    while True:
        runs = await asyncio.to_thread(sweeps.members, sweep_id)
        met = all(RunStatus(run.status) in FINISHED for run in runs)
        left = deadline - time.monotonic()
        if met or left <= 0:
            detail = await asyncio.to_thread(sweeps.get, sweep_id)
            return SweepWaitOut(**detail.model_dump(), condition_met=met)
        await asyncio.sleep(min(POLL_S, left))
