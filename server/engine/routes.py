"""GET /engine: the engine host's pid and start time, the base models it holds with their bytes,
the adapters in its samplers' slots, its clients (the server, runs) and its decode queue."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from server.engine.deps import engine_service
from server.engine.schemas import EngineOut
from server.engine.service import EngineService

router = APIRouter(tags=["engine"])


@router.get("/engine")
async def engine_status(engine: Annotated[EngineService, Depends(engine_service)]) -> EngineOut:
    """The host as it is now (`running: false` when none runs: a read starts nothing)."""
    return await run_in_threadpool(engine.status)
