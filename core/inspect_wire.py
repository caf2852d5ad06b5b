"""What an environment inspector and the server say to each other, one JSON line each: the
inspector's first line describes the environment's config (or why the file cannot be imported),
then each `Validate` the server sends gets one answer. Ours (runners.inspector) sends these
models; the Atropos and verifiers inspectors write the same JSON with their own stdlib copy
(runners/doors/envside/inspect_protocol.py), since nothing of ours imports there.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from core.line import Line


class Validate(Line):
    """Server to inspector: values to validate as the environment's config validates them;
    with `load`, the environment is also loaded with them as a run would load it (verifiers):
    a `Failed` answer then says why a run could not start."""

    values: dict[str, Any]
    load: bool = False


class Described(Line):
    """The config's fields, JSON schema and defaults: what the server shows and edits."""

    kind: Literal["described"] = "described"
    fields: list[str]
    config_schema: dict[str, Any] = Field(alias="schema")
    defaults: dict[str, Any]
    locked: list[str] = Field(default_factory=list)
    # Atropos: what its config_init() gave of the servers it samples from.
    servers: dict[str, Any] | None = None


class Validated(Line):
    kind: Literal["validated"] = "validated"
    values: dict[str, Any]  # as the config dumps them


class Invalid(Line):
    kind: Literal["invalid"] = "invalid"
    errors: list[dict[str, Any]]  # pydantic's errors, JSON only (plain_error)


class Failed(Line):
    """The file's import, or its config's validator, raised or exited: what and where."""

    kind: Literal["failed"] = "failed"
    error: str


InspectorAnswer = Annotated[Described | Validated | Invalid | Failed, Field(discriminator="kind")]
ANSWER: TypeAdapter[InspectorAnswer] = TypeAdapter(InspectorAnswer)
VALIDATE: TypeAdapter[Validate] = TypeAdapter(Validate)


def plain_error(err: Any) -> dict[str, Any]:
    """A pydantic validation error with only JSON in it (`ctx` may hold exception objects)."""
    out: dict[str, Any] = {"loc": list(err.get("loc", ())), "msg": str(err.get("msg", "invalid"))}
    if "input" in err:
        try:
            json.dumps(err["input"])
            out["input"] = err["input"]
        except (TypeError, ValueError):
            out["input"] = repr(err["input"])[:200]
    return out
