"""Sweeps: start a grid (or list) of runs at once, read their results side by side, wait on
them, stop them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query

from core.models import SWEEP_ID
from server.runs.wait import MAX_WAIT_S
from server.sweeps.deps import sweep_service
from server.sweeps.schemas import (
    SweepCreatedOut,
    SweepCreateIn,
    SweepDetailOut,
    SweepOut,
    SweepStoppedOut,
    SweepWaitOut,
)
from server.sweeps.service import SweepService
from server.sweeps.wait import wait_for_sweep

router = APIRouter(tags=["sweeps"])
Sweeps = Annotated[SweepService, Depends(sweep_service)]
SweepId = Annotated[
    str, Path(pattern=SWEEP_ID.pattern, description="A sweep id such as s-3f9c2a1b")
]


@router.post("/sweeps")
def create_sweep(
    body: SweepCreateIn,
    sweeps: Sweeps,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)
    ] = None,
) -> SweepCreatedOut:
    """Every combination is validated first: one bad value is a 422 naming it, and nothing
    is created. The runs then go through the normal queue."""
    return sweeps.create(
        body.environment,
        body.base,
        body.grid,
        body.runs,
        body.metric,
        body.goal,
        body.max_runs,
        idempotency_key,
    )


@router.get("/sweeps")
def list_sweeps(
    sweeps: Sweeps,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> list[SweepOut]:
    return sweeps.list(limit, offset)


@router.get("/sweeps/{sweep_id}")
def get_sweep(sweep_id: SweepId, sweeps: Sweeps) -> SweepDetailOut:
    return sweeps.get(sweep_id)


@router.get("/sweeps/{sweep_id}/wait")
async def wait_sweep(
    sweep_id: SweepId,
    sweeps: Sweeps,
    timeout: Annotated[
        float, Query(ge=0, le=MAX_WAIT_S, description="Seconds to wait at most")
    ] = 60.0,
) -> SweepWaitOut:
    """Answer once every run of the sweep has finished, or when `timeout` passes."""
    return await wait_for_sweep(sweeps, sweep_id, timeout)


@router.post("/sweeps/{sweep_id}/stop")
def stop_sweep(sweep_id: SweepId, sweeps: Sweeps) -> SweepStoppedOut:
    return sweeps.stop(sweep_id)
