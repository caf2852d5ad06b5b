"""Database tables (SQLModel) and the run status enum. Timestamps are UTC, named *_at."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import BigInteger, Index
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
# Run.source of the runs started through our API, and Run.source and Run.launcher of a session
# of a Tinker SDK script served by the server's Tinker API (never queued, never a runner).
API_SOURCE = "api"
TINKER_API = "tinker-api"

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
    # Who started it: our API ("api") or a Tinker SDK script's session ("tinker-api").
    source: str = Field(default=API_SOURCE, max_length=16)
    # A sweep's member, and a fork's origin: the run and step whose checkpoint it starts from.
    sweep_id: str | None = Field(default=None, index=True, max_length=32)
    parent_run_id: str | None = Field(default=None, max_length=32)
    parent_step: int | None = None
    idempotency_key: str | None = Field(default=None, unique=True)
    # What it spent, over all its attempts (core/cost.py); None: nothing of the kind measured.
    cost_device: str | None = Field(default=None, max_length=16)
    cost_device_s: float | None = None
    cost_cpu_s: float | None = None
    cost_tokens_prefill: int | None = Field(default=None, sa_type=BigInteger)
    cost_tokens_sampled: int | None = Field(default=None, sa_type=BigInteger)
    cost_tokens_trained: int | None = Field(default=None, sa_type=BigInteger)
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
    kind: str = Field(
        description="state (for resume), sampler (weights for sampling) or external (an "
        "adapter exported for download: a Tinker session's save_weights_external)"
    )
    name: str
    path: str
    created_at: datetime = Field(default_factory=utcnow)
    # A Tinker session's ttl_seconds: the folder and row are deleted once this passes.
    expires_at: datetime | None = None
    public: bool = False  # publish_checkpoint (recorded; every checkpoint here is readable)


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


# Sweep ids: "s-" and 8 hex digits; webhook ids "wh-" and 8 hex digits.
SWEEP_ID = re.compile(r"^s-[0-9a-f]{8}$")
WEBHOOK_ID = re.compile(r"^wh-[0-9a-f]{8}$")


class Sweep(SQLModel, table=True):
    """A family of runs started together from one base config and a grid (or a list)."""

    id: str = Field(primary_key=True, max_length=32)
    environment: str
    base_json: str = Field(description="The overrides every member shares")
    combos_json: str = Field(description="Each member's own overrides, by run id")
    metric: str = Field(description="The metric the best run is chosen by")
    goal: str = Field(default="max", description="max or min")
    idempotency_key: str | None = Field(default=None, unique=True)
    created_at: datetime = Field(default_factory=utcnow, index=True)
    finished_at: datetime | None = None


class RunEvent(SQLModel, table=True):
    """Outbox of things that happened (a status change, a step, a stall, a sweep's end),
    written in the same transaction as the change; webhooks are fanned out from it."""

    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(description="run.started, run.step, run.succeeded, ... sweep.finished")
    run_id: str | None = Field(default=None, index=True, max_length=32)
    sweep_id: str | None = Field(default=None, max_length=32)
    step: int | None = None
    # Events that must happen once (a stall, a sweep's end) carry a unique key.
    key: str | None = Field(default=None, unique=True)
    fanned_out: bool = Field(default=False, index=True)
    created_at: datetime = Field(default_factory=utcnow)


class Webhook(SQLModel, table=True):
    """A receiver of events. Its signing secret is derived from the server's key, not stored."""

    id: str = Field(primary_key=True, max_length=32)
    url: str
    events_json: str
    step_every: int = 1
    created_at: datetime = Field(default_factory=utcnow)


class WebhookDelivery(SQLModel, table=True):
    """One event for one webhook: its frozen body, attempts and outcome (at least once)."""

    __table_args__ = (Index("ix_delivery_webhook_event", "webhook_id", "event_id", unique=True),)

    id: str = Field(primary_key=True, max_length=40)
    webhook_id: str = Field(index=True, max_length=32)
    event_id: int
    kind: str
    # Deliveries with the same order key (a run, or a sweep) go out one at a time, in order.
    order_key: str
    body: str
    status: str = Field(default="pending", index=True, description="pending, delivered, failed")
    attempts: int = 0
    next_attempt_at: datetime = Field(default_factory=utcnow)
    last_error: str | None = None
    last_status_code: int | None = None
    created_at: datetime = Field(default_factory=utcnow)
    delivered_at: datetime | None = None


class Rollout(SQLModel, table=True):
    """One kept episode of a step (an Atropos sequence, a Tinker sample or datum): the columns
    a reader filters on, the rest as JSON (core/rollouts.py, DESIGN §14)."""

    __table_args__ = (
        Index("ix_rollout_run_step", "run_id", "step", "id"),
        Index("ix_rollout_run_prompt", "run_id", "prompt_key"),
    )

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="run.id", max_length=32)
    step: int
    kind: str = Field(max_length=16, description="episode, sequence (Atropos), sample or datum")
    group_index: int | None = None
    position: int = Field(description="Its place among the step's episodes")
    reward: float | None = None
    advantage: float | None = None
    picked: str = Field(max_length=8, description="all, best, worst or random")
    prompt_key: str = Field(max_length=16, description="The same prompt, across steps")
    body_json: str
    size: int = Field(description="Bytes of body_json: what the run's size cap counts")


class RolloutStep(SQLModel, table=True):
    """A step's record: how many episodes it had and kept, their rewards (over all it had),
    the environment's step metrics, and what happened to it (thinned, stopped)."""

    run_id: str = Field(foreign_key="run.id", primary_key=True, max_length=32)
    step: int = Field(primary_key=True)
    kind: str = Field(max_length=16)
    sampled: int
    recorded: int
    kept: int = Field(description="Rows left: recorded, less what the size cap thinned")
    size: int
    reward_mean: float | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    metrics_json: str = "{}"
    note: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
