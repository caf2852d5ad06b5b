"""Bodies of the sweep routes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from server.runs.schemas import RunCreatedOut
from server.schemas import MAX_FIELDS, Request

MAX_SWEEP_RUNS = 5000


class SweepCreateIn(Request):
    """A base config shared by every run, and a grid (all combinations) or a list of runs."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "environment": "arithmetic",
                    "base": {"total_steps": 20},
                    "grid": {"learning_rate": [1e-5, 4e-5], "seed": [0, 1, 2]},
                    "metric": "reward_mean",
                }
            ]
        },
    )

    environment: str | None = Field(None, min_length=1, max_length=128)
    base: dict[str, Any] = Field(
        default_factory=dict, max_length=MAX_FIELDS, description="Overrides every run shares"
    )
    grid: dict[str, list[Any]] | None = Field(
        None, max_length=MAX_FIELDS, description="field -> values; every combination is a run"
    )
    runs: list[dict[str, Any]] | None = Field(
        None, min_length=1, max_length=MAX_SWEEP_RUNS, description="Each run's own overrides"
    )
    metric: str = Field(
        "reward_mean",
        min_length=1,
        max_length=128,
        description="Picks the best run: a summary name (reward_mean, loss, percent_correct, "
        "eval_percent_correct) or any recorded metric key (e.g. env/percent_correct)",
    )
    goal: Literal["max", "min"] = "max"
    max_runs: int = Field(
        100, ge=1, le=MAX_SWEEP_RUNS, description="Refuse a sweep with more runs than this"
    )


class SweepCreatedOut(BaseModel):
    sweep_id: str
    run_ids: list[str]


class SweepOut(BaseModel):
    sweep_id: str
    environment: str
    base: dict[str, Any]
    metric: str
    goal: str
    status: str = Field(description="running until every run has finished, then finished")
    runs_total: int
    runs_finished: int
    counts: dict[str, int] = Field(description="Runs by status")
    created_at: str | None
    finished_at: str | None


class SweepRunOut(BaseModel):
    run_id: str
    overrides: dict[str, Any]
    status: str
    step: int
    total_steps: int
    failure_kind: str | None
    metrics: dict[str, Any]
    value: float | None = Field(description="The sweep's metric for this run (latest)")


class SweepBestOut(BaseModel):
    run_id: str
    value: float
    overrides: dict[str, Any]
    status: str
    final: bool = Field(description="False while runs of the sweep are still going")


class SweepDetailOut(SweepOut):
    runs: list[SweepRunOut]
    best: SweepBestOut | None


class SweepStoppedOut(BaseModel):
    sweep_id: str
    runs: list[RunCreatedOut]


class SweepWaitOut(SweepDetailOut):
    condition_met: bool = Field(description="False when the timeout passed first")
