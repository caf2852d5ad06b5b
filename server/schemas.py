"""What every route's bodies share: requests forbid extra keys, errors carry `detail`, and
override maps are bounded."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
)

from server.errors import InvalidValue


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorOut(BaseModel):
    detail: str = Field(description="What is wrong and how to fix it")


MAX_FIELDS = 256  # more config fields than any environment has


def bounded_overrides(extra: dict[str, Any] | None) -> dict[str, Any]:
    overrides = dict(extra or {})
    if len(overrides) > MAX_FIELDS:
        raise InvalidValue(
            f"body: {len(overrides)} override fields; at most {MAX_FIELDS} (no environment "
            "has more config fields)."
        )
    return overrides


Prompt = Annotated[str, StringConstraints(min_length=1, max_length=16_000)]
