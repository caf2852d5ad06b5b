"""The environment inspector: `python -m runners.inspector FILE CLASS` imports one environment
file in a process of its own and answers questions about its Config (fields, schema,
validation), so environment code never runs inside the API server.

Protocol (core.inspect_wire): the first line it writes describes the class (or the import
error); then one answer per `Validate` line. The lines travel on private copies of stdin and
stdout (core.child.LineChannel): what the environment's code prints is thrown away and what
it reads is nothing, so it cannot touch the protocol. Input is read from the start, on a
thread of its own: an import that never returns still ends with the server.
"""

from __future__ import annotations

import threading
import traceback
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.child import LineChannel
from core.inspect_wire import VALIDATE, Described, Failed, Invalid, Validate, Validated, plain_error
from environments.base import EnvConfig
from environments.support.loader import load_env_class


def describe(config_cls: type[EnvConfig]) -> Described:
    fields = config_cls.model_fields
    return Described(
        fields=sorted(fields),
        locked=sorted(config_cls.locked_fields()),
        config_schema=config_cls.model_json_schema(),
        defaults={
            "model_name": fields["model_name"].default,
            "backend": fields["backend"].default,
        },
    )


def validate(config_cls: type[EnvConfig], values: Any) -> Validated | Invalid:
    """Strict validation, as the server requires: JSON types, no coercion from strings."""
    try:
        config = config_cls.model_validate(values, strict=True)
    except ValidationError as exc:
        return Invalid(errors=[plain_error(err) for err in exc.errors(include_url=False)])
    return Validated(values=config.model_dump(mode="json"))


def describe_failure(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def main(argv: list[str]) -> int:
    path, class_name = Path(argv[0]), argv[1]
    channel = LineChannel(prints="nowhere")  # an environment may flood its output
    loaded: list[type[EnvConfig]] = []
    described = threading.Event()

    def answer(request: Validate) -> None:
        described.wait()  # the server asks only after the first line; this keeps it so
        try:
            channel.send(validate(loaded[0], request.values))
        except BaseException as exc:  # a validator may raise anything, SystemExit included
            channel.send(Failed(error=describe_failure(exc)))

    channel.serve_lines_in_background(VALIDATE, answer)
    try:
        loaded.append(load_env_class(path, class_name).Config)
        first: Described | Failed = describe(loaded[0])
    except BaseException as exc:  # SystemExit and all: user code runs at import
        first = Failed(error=describe_failure(exc))
    channel.send(first)
    if isinstance(first, Failed):
        return 0
    described.set()
    threading.Event().wait()  # answering on the reading thread until the input ends
    return 0
