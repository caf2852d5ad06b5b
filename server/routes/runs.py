"""Training runs: start, list, inspect, stop, logs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query
from fastapi.responses import StreamingResponse

from server.deps import Services, services
from server.models import RunStatus
from server.schemas import RunCreatedOut, RunCreateIn, RunDetailOut, RunLogsOut, RunSummaryOut
from server.services.log_follow import follow
from server.services.runs import RUN_ID

router = APIRouter(tags=["runs"])
Svc = Annotated[Services, Depends(services)]
RunId = Annotated[str, Path(pattern=RUN_ID.pattern, description="A run id such as r-3f9c2a1b")]


@router.post("/runs", response_model=RunCreatedOut)
def create_run(
    svc: Svc,
    body: RunCreateIn | None = None,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> dict[str, Any]:
    body = body or RunCreateIn()
    return svc.runs.create(body.environment, body.overrides(), idempotency_key)


@router.get("/runs", response_model=list[RunSummaryOut])
def list_runs(
    svc: Svc,
    status: RunStatus | None = None,
    environment: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> list[dict[str, Any]]:
    return svc.runs.list(status, environment, limit, offset)


@router.get("/runs/{run_id}", response_model=RunDetailOut)
def get_run(run_id: RunId, svc: Svc) -> dict[str, Any]:
    return svc.runs.get(run_id)


@router.post("/runs/{run_id}/stop", response_model=RunCreatedOut)
def stop_run(run_id: RunId, svc: Svc) -> dict[str, Any]:
    return svc.runs.stop(run_id)


@router.get(
    "/runs/{run_id}/logs",
    response_model=RunLogsOut,
    responses={200: {"content": {"text/event-stream": {}}}},
)
def run_logs(
    run_id: RunId,
    svc: Svc,
    tail: Annotated[int, Query(ge=0, le=10_000)] = 100,
    follow_: Annotated[bool, Query(alias="follow")] = False,
) -> Any:
    """The last `tail` lines; with follow=true a server-sent event stream that ends with an
    `end` event carrying the run's final status."""
    if not follow_:
        return svc.runs.logs(run_id, tail)
    svc.runs.row(run_id)  # 404/422 before the stream starts
    return StreamingResponse(_sse(follow(svc.runs, run_id, tail)), media_type="text/event-stream")


async def _sse(events: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[str]:
    async for kind, data in events:
        payload = data if isinstance(data, str) else json.dumps(data)
        lines = "".join(f"data: {part}\n" for part in payload.split("\n"))
        yield f"event: {kind}\n{lines}\n"
