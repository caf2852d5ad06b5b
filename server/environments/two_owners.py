"""The config of another framework's environment (Atropos, verifiers): half ours (the run's
training fields, validated by our model), half its own (validated by its class, in its
inspector), shown as one config with one JSON schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from core.inspect_wire import Failed, Invalid, Validated, plain_error
from server.environments.inspector import Ask, ConfigInvalid, InspectFailed

Trained = TypeVar("Trained", bound=BaseModel)


def training_defaults(ours: type[BaseModel]) -> dict[str, Any]:
    """What a new config of such an environment starts from, of our half: its model, backend."""
    return {name: ours.model_fields[name].default for name in ("model_name", "backend")}


def validate_by_owners(
    ours: type[Trained],
    training: dict[str, Any],
    ask: Ask,
    theirs: dict[str, Any],
    renamed: Callable[[dict[str, Any]], dict[str, Any]] = lambda error: error,
) -> tuple[Trained, dict[str, Any]]:
    """Another framework's config, each half by its owner: our training fields by `ours`
    (strictly), the environment's by its inspector; the errors of both together (the
    environment's `renamed` to the fields the user edits), ConfigInvalid then."""
    errors: list[dict[str, Any]] = []
    trained: Trained | None = None
    try:
        trained = ours.model_validate(training, strict=True)
    except ValidationError as exc:
        errors += [plain_error(e) for e in exc.errors(include_url=False)]
    valid: dict[str, Any] = {}
    match ask(theirs):
        case Validated(values=values):
            valid = values
        case Invalid(errors=invalid):
            errors += [renamed(e) for e in invalid]
        case Failed(error=error):
            raise InspectFailed(f"its config's validation failed: {error}")
        case other:
            raise InspectFailed(f"its inspector answered a validation with {other.kind}")
    if errors or trained is None:
        raise ConfigInvalid(errors)
    return trained, valid


def merged_schema(
    ours: type[BaseModel],
    theirs: dict[str, Any],
    title: str,
    description: str,
    shown_as: Callable[[str], str | None] = lambda name: name,
) -> dict[str, Any]:
    """One JSON schema: our training fields first, then the environment's own, each under the
    name the config shows it by (`shown_as`; None: ours describes it)."""
    own = ours.model_json_schema()
    copied = json.loads(json.dumps(theirs))  # the cached one stays whole
    properties = dict(own.get("properties", {}))
    for name, spec in copied.get("properties", {}).items():
        shown = shown_as(name)
        if shown is not None:
            properties[shown] = spec
    merged: dict[str, Any] = {
        "title": title,
        "description": copied.get("description") or description,
        "type": "object",
        "properties": properties,
    }
    defs = {**copied.get("$defs", {}), **own.get("$defs", {})}
    if defs:
        merged["$defs"] = defs
    return merged
