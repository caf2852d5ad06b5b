"""Tool arguments and list answers: the REST API's own models where it has one (extended only
by the path parameter a REST route takes from its URL), small ones where it reads a query."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from core.models import RUN_ID, SWEEP_ID, RunStatus
from server.environments.catalog import NAME_MAX, NAME_PATTERN
from server.environments.schemas import EnvironmentOut
from server.runs.schemas import RunCreateIn, RunForkIn, RunSummaryOut
from server.runs.wait import MAX_WAIT_S
from server.schemas import Request

RunIdField = Field(pattern=RUN_ID.pattern, description="A run id such as r-3f9c2a1b")
SweepIdField = Field(pattern=SWEEP_ID.pattern, description="A sweep id such as s-3f9c2a1b")
DEFAULT_WAIT_S = 300.0  # under the 300 s a typical MCP client waits for a silent answer


class NoArgs(Request):
    """This tool takes no arguments."""


class SelectIn(Request):
    name: str = Field(
        pattern=NAME_PATTERN.pattern,
        max_length=NAME_MAX,
        description="An environment name from rl_list_environments",
    )


class RunRef(Request):
    run_id: str = RunIdField


class ListRunsIn(Request):
    status: RunStatus | None = Field(None, description="Only runs in this status")
    environment: str | None = Field(None, max_length=128, description="Only this environment")
    limit: int = Field(100, ge=1, le=1000, description="At most this many, newest first")


class StartTrainingIn(RunCreateIn):
    """The reference client's three arguments, plus `environment` and any other config field
    as an override; a field left out keeps the value in the environment's config."""

    wandb_project: str | None = Field(None, description="W&B project (config: wandb_project)")
    lora_rank: int | None = Field(None, description="LoRA rank (config: lora_rank)")
    learning_rate: float | None = Field(None, description="Learning rate (config: learning_rate)")

    def overrides(self) -> dict[str, Any]:
        named = {"wandb_project", "lora_rank", "learning_rate"}
        given = {k: v for k, v in self.model_dump(include=named).items() if v is not None}
        return {**given, **super().overrides()}


class WaitRunIn(Request):
    run_id: str = RunIdField
    timeout_s: float = Field(
        DEFAULT_WAIT_S, ge=0, le=MAX_WAIT_S, description="Seconds to wait at most (max 600)"
    )
    until: str = Field(
        "terminal",
        max_length=32,
        description="terminal (the run has finished) or step:N (it has recorded step N)",
    )


class SweepRef(Request):
    sweep_id: str = SweepIdField


class WaitSweepIn(SweepRef):
    timeout_s: float = Field(
        DEFAULT_WAIT_S, ge=0, le=MAX_WAIT_S, description="Seconds to wait at most (max 600)"
    )


class ForkRunIn(RunForkIn):
    """The parent `run_id`, `checkpoint_step`, plus config overrides for the new run."""

    run_id: str = RunIdField


class PlotIn(Request):
    run_ids: list[Annotated[str, Field(pattern=RUN_ID.pattern)]] = Field(
        min_length=1, max_length=8, description="Runs to draw, one line each (at most 8)"
    )
    metrics: list[str] = Field(
        default_factory=lambda: ["reward/mean", "train/loss"],
        min_length=1,
        max_length=6,
        description="Metric keys, one panel each (see rl_get_results' history for the keys)",
    )


class EnvironmentsOut(BaseModel):
    environments: list[EnvironmentOut]
    count: int


class RunsOut(BaseModel):
    runs: list[RunSummaryOut]
