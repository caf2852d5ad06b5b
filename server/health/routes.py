"""GET /health (liveness and a few counts) and the dashboard at /: both open without a token;
the dashboard is a static page that calls the API with the token the user types in."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse

from server.container import Services, services
from server.health.report import health_report
from server.health.schemas import HealthOut

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthOut)
def health(svc: Annotated[Services, Depends(services)]) -> HealthOut:
    return health_report(svc)


STATIC = Path(__file__).resolve().parent.parent / "static"
DASHBOARD = STATIC / "dashboard.html"


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def dashboard() -> HTMLResponse:
    return HTMLResponse(DASHBOARD.read_text(encoding="utf-8"))
