"""Training runs: start, list, inspect, wait, stop, resume, fork, logs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request

from core.models import RUN_ID, RunStatus
from server.runs.deps import fork_service, run_service, stream_slots
from server.runs.forks import ForkService
from server.runs.logs import StreamSlots, event_stream, follow
from server.runs.schemas import (
    CheckpointOut,
    RunCreatedOut,
    RunCreateIn,
    RunDetailOut,
    RunForkedOut,
    RunForkIn,
    RunHistoryOut,
    RunLogsOut,
    RunResultsOut,
    RunResumedOut,
    RunResumeIn,
    RunSummaryOut,
    RunWaitOut,
)
from server.runs.service import RunService
from server.runs.wait import MAX_WAIT_S, wait_for_run

router = APIRouter(tags=["runs"])
Runs = Annotated[RunService, Depends(run_service)]
Forks = Annotated[ForkService, Depends(fork_service)]
Streams = Annotated[StreamSlots, Depends(stream_slots)]
RunId = Annotated[str, Path(pattern=RUN_ID.pattern, description="A run id such as r-3f9c2a1b")]


@router.post("/runs")
def create_run(
    runs: Runs,
    body: RunCreateIn | None = None,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)
    ] = None,
) -> RunCreatedOut:
    body = body or RunCreateIn()
    return runs.create(body.environment, body.overrides(), idempotency_key)


@router.get("/runs")
def list_runs(
    runs: Runs,
    status: RunStatus | None = None,
    environment: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    source: Annotated[
        Literal["api", "tinker-api"] | None,
        Query(
            description='"api" (runs started through this API) or "tinker-api" (Tinker SDK '
            "sessions)"
        ),
    ] = None,
) -> list[RunSummaryOut]:
    return runs.list(status, environment, limit, offset, source)


@router.get("/runs/{run_id}")
def get_run(run_id: RunId, runs: Runs) -> RunDetailOut:
    return runs.get(run_id)


@router.get("/runs/{run_id}/wait")
async def wait_run(
    run_id: RunId,
    runs: Runs,
    until: Annotated[
        str, Query(max_length=32, description="terminal, or step:N (step N recorded)")
    ] = "terminal",
    timeout: Annotated[
        float, Query(ge=0, le=MAX_WAIT_S, description="Seconds to wait at most")
    ] = 60.0,
) -> RunWaitOut:
    """Answer as soon as the run has finished (or reached step N), or when `timeout` passes:
    either way with its current state and whether the condition held."""
    return await wait_for_run(runs, run_id, until, timeout)


@router.post("/runs/{run_id}/stop")
def stop_run(run_id: RunId, runs: Runs) -> RunCreatedOut:
    return runs.stop(run_id)


@router.get("/runs/{run_id}/metrics")
def run_metrics(run_id: RunId, runs: Runs) -> RunResultsOut:
    """Final (or latest) metrics, the last rows of history, checkpoints and weights path."""
    return runs.results(run_id)


@router.get("/runs/{run_id}/history")
def run_history(
    run_id: RunId,
    runs: Runs,
    keys: Annotated[
        str | None, Query(max_length=2000, description="Comma-separated metric keys")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    max_points: Annotated[
        int | None,
        Query(ge=2, le=100_000, description="Thin each metric's series to at most this many"),
    ] = None,
) -> RunHistoryOut:
    return runs.history(run_id, keys, limit, max_points)


@router.get("/runs/{run_id}/checkpoints")
def run_checkpoints(run_id: RunId, runs: Runs) -> list[CheckpointOut]:
    return runs.checkpoints(run_id)


@router.post("/runs/{run_id}/resume")
def resume_run(run_id: RunId, runs: Runs, body: RunResumeIn | None = None) -> RunResumedOut:
    body = body or RunResumeIn()
    return runs.resume(run_id, body.overrides(), body.force, body.checkpoint_step)


@router.post("/runs/{run_id}/fork")
def fork_run(run_id: RunId, forks: Forks, body: RunForkIn | None = None) -> RunForkedOut:
    """A new run from this run's state checkpoint (weights and optimizer state) with the
    parent's config plus the overrides; its steps continue from the checkpoint's step."""
    body = body or RunForkIn()
    return forks.fork(run_id, body.overrides(), body.checkpoint_step)


@router.get(
    "/runs/{run_id}/logs",
    response_model=RunLogsOut,
    responses={200: {"content": {"text/event-stream": {}}}},
)
def run_logs(
    run_id: RunId,
    runs: Runs,
    streams: Streams,
    request: Request,
    tail: Annotated[int, Query(ge=0, le=10_000)] = 100,
    follow_: Annotated[bool, Query(alias="follow")] = False,
) -> Any:
    """The last `tail` lines; with follow=true a server-sent event stream (`line` events, a bare
    CR inside a line as a break between data lines) that ends with an `end` event carrying the
    run's final status."""
    if not follow_:
        return runs.logs(run_id, tail)
    runs.row(run_id)  # 404/422 before the stream starts
    client = request.client.host if request.client else "local"
    return event_stream(streams.open(client, follow(runs, run_id, tail)))
