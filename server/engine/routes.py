"""GET /engine: the engine host's pid and start time, the base models it holds with their bytes,
the adapters in its samplers' slots, its clients (the server, runs) and its decode queue."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from server.deps import Services, services
from server.engine.schemas import EngineOut

router = APIRouter(tags=["engine"])


@router.get("/engine")
async def engine_status(svc: Annotated[Services, Depends(services)]) -> EngineOut:
    """The host as it is now (`running: false` when none runs: a read starts nothing)."""
    return await run_in_threadpool(svc.engine_status.status)
