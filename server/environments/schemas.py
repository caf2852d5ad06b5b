"""Bodies of the environment and config routes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from server.schemas import MAX_FIELDS, Request


class EnvironmentOut(BaseModel):
    name: str
    class_name: str | None
    file_path: str
    description: str
    importable: bool | None = Field(description="null until an import was attempted")
    error: str | None
    framework: Literal["rlcs", "atropos"] = Field(
        description="Whose BaseEnv the class derives from: ours (environments.base) or "
        "Atropos's (atroposlib.envs.base, trained unchanged; docs/atropos.md)"
    )


class SelectOut(BaseModel):
    selected: str
    file_path: str
    class_name: str | None
    description: str
    framework: Literal["rlcs", "atropos"]
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
