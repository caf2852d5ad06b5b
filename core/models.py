"""Database tables (SQLModel) and the run status enum. Timestamps are UTC, named *_at."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import Index
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    """Now, timezone-aware in UTC (the database stores and returns aware datetimes)."""
    return datetime.now(UTC)


def iso(ts: datetime | None) -> str | None:
    """ISO 8601 in UTC with a Z, as answers show times."""
    if ts is None:
        return None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


# Run ids: "r-" and 8 hex digits, checked on every path that takes one.
RUN_ID = re.compile(r"^r-[0-9a-f]{8}$")


class RunStatus(StrEnum):
    queued = "queued"
    starting = "starting"
    running = "running"
    stopping = "stopping"
    succeeded = "succeeded"
    failed = "failed"
    stopped = "stopped"


# Run.launcher of a run whose attempt is a Ray job (RLCS_LAUNCHER=ray).
RAY_LAUNCHER = "ray"

FINISHED = frozenset({RunStatus.succeeded, RunStatus.failed, RunStatus.stopped})
ACTIVE = frozenset({RunStatus.starting, RunStatus.running, RunStatus.stopping})


class Run(SQLModel, table=True):
    id: str = Field(primary_key=True, max_length=32)
    environment: str = Field(index=True)
    status: RunStatus = Field(default=RunStatus.queued, index=True)
    config_json: str
    config_hash: str
    step: int = 0
    total_steps: int = 0
    attempt: int = 1
    pid: int | None = None
    process_start: float | None = Field(default=None, description="Kernel start time of pid")
    exit_code: int | None = None
    failure_kind: str | None = None
    details: str | None = None
    wandb_path: str | None = None
    wandb_url: str | None = None
    weights_path: str | None = None
    run_dir: str
    # Which launcher started the current attempt ("local" or RAY_LAUNCHER; None = not yet
    # started, or started before launchers were recorded, i.e. local) and its Ray job id.
    launcher: str | None = None
    job_id: str | None = Field(default=None, max_length=64)
    idempotency_key: str | None = Field(default=None, unique=True)
    created_at: datetime = Field(default_factory=utcnow, index=True)
    started_at: datetime | None = None
    last_step_at: datetime | None = None
    stop_requested_at: datetime | None = None
    finished_at: datetime | None = None


class Metric(SQLModel, table=True):
    # Latest values and history read a run's rows by step: this index serves both orders.
    __table_args__ = (Index("ix_metric_run_step", "run_id", "step", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="run.id", index=True)
    step: int
    values_json: str
    created_at: datetime = Field(default_factory=utcnow)


class Checkpoint(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="run.id", index=True)
    step: int
    kind: str = Field(description="state (for resume) or sampler (weights for sampling)")
    name: str
    path: str
    created_at: datetime = Field(default_factory=utcnow)


class EnvironmentConfig(SQLModel, table=True):
    """One row per saved version of an environment's edited fields; the highest is current."""

    environment: str = Field(primary_key=True)
    version: int = Field(primary_key=True)
    values_json: str
    updated_at: datetime = Field(default_factory=utcnow)


class Selection(SQLModel, table=True):
    """The environment chosen with POST /environments/{name}/select (a single row, id 1)."""

    id: int = Field(default=1, primary_key=True)
    environment: str
    selected_at: datetime = Field(default_factory=utcnow)
