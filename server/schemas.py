"""Request and response bodies of the HTTP API (requests forbid extra keys)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    create_model,
    model_validator,
)

from core.models import RUN_ID
from server.errors import InvalidValue


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorOut(BaseModel):
    detail: str = Field(description="What is wrong and how to fix it")


class LauncherOut(BaseModel):
    kind: str = Field(description="local (child processes) or ray (RLCS_LAUNCHER)")
    address: str | None = Field(description="The Ray job server (RLCS_RAY_ADDRESS)")
    reachable: bool
    reason: str | None = Field(description="Why the launcher cannot start runs now")


class HealthOut(BaseModel):
    status: str
    version: str
    backend: str
    environments: int
    active_runs: int
    supervisor: str = Field(
        description="'supervising', or 'standing by: <why>' when another server supervises"
    )
    launcher: LauncherOut


class EnvironmentOut(BaseModel):
    name: str
    class_name: str | None
    file_path: str
    description: str
    importable: bool | None = Field(description="null until an import was attempted")
    error: str | None


class SelectOut(BaseModel):
    selected: str
    file_path: str
    class_name: str | None
    description: str
    config: dict[str, Any]


class ConfigOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    environment: str
    configurable_fields: dict[str, Any]
    locked_fields: dict[str, Any]
    schema_: dict[str, Any] = Field(alias="schema", serialization_alias="schema")
    version: int
    updated_at: str | None


MAX_FIELDS = 256  # more config fields than any environment has


def bounded_overrides(extra: dict[str, Any] | None) -> dict[str, Any]:
    overrides = dict(extra or {})
    if len(overrides) > MAX_FIELDS:
        raise InvalidValue(
            f"body: {len(overrides)} override fields; at most {MAX_FIELDS} (no environment "
            "has more config fields)."
        )
    return overrides


class ConfigEditIn(Request):
    field: str = Field(min_length=1, max_length=128)
    value: Any = Field(description="The new value, as its JSON type")


class ConfigPutIn(Request):
    values: dict[str, Any] = Field(
        max_length=MAX_FIELDS, description="Fields to change, validated together"
    )


class RunCreateIn(BaseModel):
    """Optional `environment` (default: the selected one) plus any config fields as overrides."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [{"wandb_project": "rl-training", "lora_rank": 8, "learning_rate": 4e-5}]
        },
    )

    environment: str | None = Field(None, min_length=1, max_length=128)

    def overrides(self) -> dict[str, Any]:
        return bounded_overrides(self.model_extra)


class RunCreatedOut(BaseModel):
    run_id: str
    status: str


class RunSummaryOut(BaseModel):
    run_id: str
    environment: str
    status: str
    step: int
    total_steps: int
    attempt: int
    failure_kind: str | None
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    model_name: str | None = None
    reward_mean: float | None = Field(None, description="Mean reward at the newest step")
    eta_s: float | None = None
    stalled: bool = False
    sweep_id: str | None = Field(None, description="The sweep this run belongs to")
    parent_run_id: str | None = Field(None, description="A fork's parent run")
    parent_step: int | None = Field(None, description="The parent's step the fork started at")


class RunDetailOut(RunSummaryOut):
    metrics: dict[str, Any]
    metrics_source: str
    metrics_note: str | None
    wandb_url: str | None
    wandb_path: str | None
    weights_path: str | None
    error: str | None
    details: str | None
    exit_code: int | None
    pid: int | None
    config_hash: str
    config: dict[str, Any] = Field(description="The frozen, resolved config the run trains with")
    stalled: bool
    stall_details: str | None
    progress: dict[str, Any]
    last_step_at: str | None


class RunWaitOut(RunDetailOut):
    condition_met: bool = Field(description="False when the timeout passed first")


class RunLogsOut(BaseModel):
    run_id: str
    status: str
    lines: list[str]


class RunResumeIn(BaseModel):
    """`force`, `checkpoint_step`, plus config overrides (e.g. a larger total_steps)."""

    model_config = ConfigDict(extra="allow")

    force: bool = Field(False, description="Resume even if the overrides change the config hash")
    checkpoint_step: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="Resume from the state checkpoint of this step (default: the last one); "
        "steps after it are done again and their metrics replaced",
    )

    def overrides(self) -> dict[str, Any]:
        return bounded_overrides(self.model_extra)


class RunResumedOut(BaseModel):
    run_id: str
    status: str
    attempt: int
    resume_step: int
    resume_from: str


Prompt = Annotated[str, StringConstraints(min_length=1, max_length=16_000)]


class InferenceIn(Request):
    """Free `prompts`, or `num_items` tasks drawn from the environment (held-out split)."""

    # Both capped by RLCS_INFERENCE_MAX_PROMPTS: see `inference_in`.
    prompts: list[Prompt] | None = Field(None, min_length=1)
    max_tokens: int = Field(256, ge=1, le=4096)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    environment: str | None = Field(
        None, min_length=1, max_length=128, description="Default: the selected environment"
    )
    model: str | None = Field(
        None, min_length=1, max_length=256, description="Default: the environment's model_name"
    )
    run_id: str | None = Field(
        None, pattern=RUN_ID.pattern, description="Sample from this run's trained adapter"
    )
    checkpoint_step: int | None = Field(
        None, ge=0, le=1_000_000, description="Which of the run's checkpoints (default: last)"
    )
    num_items: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _one_source(self) -> InferenceIn:
        if (self.prompts is None) == (self.num_items is None):
            raise ValueError("give either prompts (a list of strings) or num_items, not both")
        if self.model is not None and self.run_id is not None:
            raise ValueError("give model or run_id, not both (a run fixes its model)")
        if self.checkpoint_step is not None and self.run_id is None:
            raise ValueError("checkpoint_step needs run_id")
        return self


def inference_in(max_prompts: int) -> type[InferenceIn]:
    """InferenceIn with the server's prompt cap (the setting inference_max_prompts)."""
    return create_model(
        "InferenceIn",
        __base__=InferenceIn,
        __doc__=InferenceIn.__doc__,
        prompts=(list[Prompt] | None, Field(None, min_length=1, max_length=max_prompts)),
        num_items=(int | None, Field(None, ge=1, le=max_prompts)),
    )


class InferenceResult(BaseModel):
    prompt: str | None
    response: str
    score: float | None
    correct: bool | None
    reason: str | None = None
    truncated: bool = Field(
        False, description="Cut short by the request's time budget or the model's context"
    )
    tokens: int
    turns: list[dict[str, Any]] | None = None


class InferenceOut(BaseModel):
    environment: str
    model: str
    adapter: str | None
    backend: str
    results: list[InferenceResult]
    summary: dict[str, Any]


class CheckpointOut(BaseModel):
    step: int
    kind: str
    name: str
    path: str
    created_at: str | None


class RunResultsOut(BaseModel):
    run_id: str
    environment: str
    status: str
    step: int
    total_steps: int
    final: bool
    metrics: dict[str, Any]
    metrics_source: str
    metrics_note: str | None
    latest: dict[str, Any]
    history: list[dict[str, Any]]
    wandb_url: str | None
    weights_path: str | None
    checkpoints: list[CheckpointOut]


class RunHistoryOut(BaseModel):
    run_id: str
    keys: list[str] | None
    rows: list[dict[str, Any]]


class RunForkIn(BaseModel):
    """`checkpoint_step` (default: the parent's newest state checkpoint) plus config
    overrides for the new run (e.g. a learning_rate and a larger total_steps)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"examples": [{"learning_rate": 1e-5, "total_steps": 40}]},
    )

    checkpoint_step: int | None = Field(
        None, ge=0, le=1_000_000, description="Start from the parent's checkpoint at this step"
    )

    def overrides(self) -> dict[str, Any]:
        return bounded_overrides(self.model_extra)


class RunForkedOut(BaseModel):
    run_id: str
    status: str
    parent_run_id: str
    parent_step: int
    resume_from: str


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
