"""Bodies of the environment and config routes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from core.frameworks import Framework
from server.schemas import MAX_FIELDS, Request


class DependenciesOut(BaseModel):
    state: Literal["none", "installing", "installed", "failed"] = Field(
        description="none: it asks for nothing beyond verifiers; failed: see error (it cannot "
        "be configured or run until its pyproject.toml is fixed)"
    )
    requirements: list[str]
    error: str | None


class EnvironmentOut(BaseModel):
    name: str
    class_name: str | None
    file_path: str
    description: str
    importable: bool | None = Field(description="null until an import was attempted")
    error: str | None
    framework: Framework = Field(
        description="Whose environment it is: ours (environments.base), Atropos's "
        "(atroposlib.envs.base, trained unchanged; docs/atropos.md) or a verifiers "
        "environment folder (trained unchanged; docs/verifiers.md)"
    )
    generation: Literal["v0", "v1"] | None = Field(
        None,
        description="verifiers: v0 (load_environment) or v1 (verifiers.v1 Taskset); null for "
        "the others",
    )
    dependencies: DependenciesOut | None = Field(
        None,
        description="verifiers: its own dependencies (its pyproject.toml's, verifiers aside), "
        "installed into the verifiers interpreter when it is first listed; null for the others",
    )


class SelectOut(BaseModel):
    selected: str
    file_path: str
    class_name: str | None
    description: str
    framework: Framework
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
    values: dict[str, Any] = Field(
        max_length=MAX_FIELDS, description="Fields to change, validated together"
    )
