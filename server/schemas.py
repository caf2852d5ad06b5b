"""Request and response bodies of the HTTP API (requests forbid extra keys)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorOut(BaseModel):
    detail: str = Field(description="What is wrong and how to fix it")


class HealthOut(BaseModel):
    status: str
    version: str
    backend: str
    environments: int
    active_runs: int


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


class ConfigEditIn(Request):
    field: str = Field(min_length=1, max_length=128)
    value: Any = Field(description="The new value, as its JSON type")


class ConfigPutIn(Request):
    values: dict[str, Any] = Field(description="Fields to change, validated together")


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
        return dict(self.model_extra or {})


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
    stalled: bool
    stall_details: str | None
    progress: dict[str, Any]
    last_step_at: str | None


class RunLogsOut(BaseModel):
    run_id: str
    status: str
    lines: list[str]
