"""Bodies of the run routes (create, read, stop, resume, fork, results, history)."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from server.schemas import bounded_overrides


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


class RunCostBriefOut(BaseModel):
    """What a run spent over all its attempts, as lists show it (docs/runs.md)."""

    device_s: float | None = Field(
        None, description="Wall seconds the run held its device (None: not measured)"
    )
    tokens: int | None = Field(None, description="Tokens prefilled, sampled and trained, together")
    money: float | None = Field(
        None,
        description="What that cost at the prices in force; None: no price applies (GET "
        "/runs/{id} says why in cost.note)",
    )
    currency: str | None = None


class CostPartsOut(BaseModel):
    """The money of each priced quantity (None: not priced)."""

    device: float | None
    prefill: float | None
    sampled: float | None
    trained: float | None


class RunCostOut(RunCostBriefOut):
    device: str | None = Field(
        None,
        description="Where the device seconds went: the local engine's torch device (cpu, "
        "cuda), or tinker (hosted Tinker did the work, billed by the token)",
    )
    cpu_s: float | None = Field(None, description="CPU seconds of the run's process, all threads")
    tokens_prefill: int | None = Field(None, description="Prompt tokens prefilled for sampling")
    tokens_sampled: int | None = Field(None, description="Tokens sampled (generated)")
    tokens_trained: int | None = Field(
        None, description="Tokens trained on: every token of every datum, forward and backward"
    )
    money_parts: CostPartsOut | None = None
    basis: str | None = Field(None, description="The prices the money comes from")
    note: str | None = Field(None, description="Why there is no money, or what it leaves out")


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
    source: str = Field(
        "api",
        description='Who started the run: "api" (POST /runs, a sweep, a fork) or "tinker-api" '
        "(the session of a Tinker SDK script served at /api/v1)",
    )
    display_name: str | None = Field(
        None,
        description="A Tinker SDK session's name, as its script gave it "
        "(ServiceClient(display_name=...)); null for other runs",
    )
    cost: RunCostBriefOut | None = Field(None, description="What the run spent")


class RunProgressOut(BaseModel):
    fraction: float = Field(description="step / total_steps, at most 1")
    time_per_step_s: float | None = Field(description="Mean over the steps this run trained")
    eta_s: float | None = Field(description="While running: seconds until total_steps")


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
    progress: RunProgressOut
    last_step_at: str | None
    cost: RunCostOut | None = Field(None, description="What the run spent, and its money")


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


# Export (POST /runs/{id}/export) ---------------------------------------------------------


class ExportIn(BaseModel):
    """Which checkpoint (default: the newest sampler checkpoint), whether to merge the adapter
    into the base model, and where to write (default: the run's folder, `export/step-N`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"checkpoint_step": 20, "merged": True, "path": "mine"}]},
    )

    checkpoint_step: int | None = Field(
        None, ge=0, le=1_000_000, description="Export the sampler checkpoint at this step"
    )
    merged: bool = Field(False, description="Write the base model with the adapter merged in")
    path: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="A folder inside the export folder (RLCS_EXPORT_DIR); relative names are "
        "taken inside it",
    )
    overwrite: bool = Field(False, description="Replace a destination that holds files")
    include_rollouts: bool = Field(
        False,
        description="Add rollouts.jsonl: every episode the run recorded (GET "
        "/runs/{id}/rollouts's items, in step order)",
    )


class ExportOut(BaseModel):
    run_id: str
    step: int
    path: str
    files: list[str]
    merged: bool
    format: str | None = Field(
        None, description="peft-lora, hf-merged, or tinker-external (as Tinker writes it)"
    )
    base_model: str | None = None
