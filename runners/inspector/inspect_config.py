"""The environment inspector: `python -m runners.inspector FILE CLASS` imports one environment
file in a process of its own and answers questions about its Config (fields, schema,
validation), so environment code never runs inside the API server.

Protocol: the first line it writes describes the class (or the import error); then one JSON
request per line on stdin, one JSON answer per line. Answers go to a private copy of stdout:
whatever the environment's code prints is thrown away, so it cannot corrupt the protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from environments.base import EnvConfig
from environments.support.loader import load_env_class
from runners.inspector.protocol import Answer, plain_error, serve


def describe(config_cls: type[EnvConfig]) -> dict[str, Any]:
    fields = config_cls.model_fields
    return {
        "ok": True,
        "fields": sorted(fields),
        "locked": sorted(config_cls.locked_fields()),
        "schema": config_cls.model_json_schema(),
        "defaults": {
            "model_name": fields["model_name"].default,
            "backend": fields["backend"].default,
        },
    }


def validate(config_cls: type[EnvConfig], values: Any) -> dict[str, Any]:
    """Strict validation, as the server requires: JSON types, no coercion from strings."""
    try:
        config = config_cls.model_validate(values, strict=True)
    except ValidationError as exc:
        return {"ok": False, "errors": [plain_error(err) for err in exc.errors(include_url=False)]}
    return {"ok": True, "values": config.model_dump(mode="json")}


def main(argv: list[str]) -> int:
    path, class_name = Path(argv[0]), argv[1]

    def describe_file() -> tuple[Answer, Callable[[Answer], Answer]]:
        config_cls = load_env_class(path, class_name).Config
        return describe(config_cls), lambda request: validate(config_cls, request.get("values"))

    return serve(describe_file)
