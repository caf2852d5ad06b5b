"""GET /health: liveness and a few counts (open without a token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from server import __version__
from server.deps import Services, services
from server.schemas import HealthOut

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthOut)
def health(svc: Annotated[Services, Depends(services)]) -> HealthOut:
    return HealthOut(
        status="ok",
        version=__version__,
        backend=svc.settings.default_backend,
        environments=len(svc.catalog.list()),
        active_runs=svc.runs.count_active(),
    )
