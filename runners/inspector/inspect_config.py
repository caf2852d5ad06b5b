"""The environment inspector: `python -m runners.inspector FILE CLASS` imports one environment
file in a process of its own and answers questions about its Config (fields, schema,
validation), so environment code never runs inside the API server.

Protocol: the first line it writes describes the class (or the import error); then one JSON
request per line on stdin, one JSON answer per line. Answers go to a private copy of stdout:
whatever the environment's code prints is thrown away, so it cannot corrupt the protocol.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from core.procs import PARENT_PID_VARIABLE
from environments.base import EnvConfig
from environments.support.loader import load_env_class


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
        return {"ok": False, "errors": [_plain(err) for err in exc.errors(include_url=False)]}
    return {"ok": True, "values": config.model_dump(mode="json")}


def _plain(err: Any) -> dict[str, Any]:
    """A validation error with only JSON in it (`ctx` may hold exception objects)."""
    out = {"loc": list(err.get("loc", ())), "msg": str(err.get("msg", "invalid"))}
    if "input" in err:
        try:
            json.dumps(err["input"])
            out["input"] = err["input"]
        except (TypeError, ValueError):
            out["input"] = repr(err["input"])[:200]
    return out


def describe_failure(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def private_stdout() -> TextIO:
    """The protocol channel: a copy of fd 1; fd 1 itself (and so print) then goes nowhere."""
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    return channel


def send(channel: TextIO, answer: dict[str, Any]) -> None:
    channel.write(json.dumps(answer) + "\n")
    channel.flush()


def exit_with_parent(every_s: float = 0.5) -> None:
    """End this process once the server that started it is gone, even in the middle of an
    import that never returns (end of stdin only says so between requests). The server names
    itself: one that died before this line ran has already handed us to another parent."""
    parent = int(os.environ.get(PARENT_PID_VARIABLE) or os.getppid())

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def main(argv: list[str]) -> int:
    path, class_name = Path(argv[0]), argv[1]
    exit_with_parent()
    channel = private_stdout()
    try:
        config_cls = load_env_class(path, class_name).Config
        first = describe(config_cls)
    except BaseException as exc:  # SystemExit and all: user code runs at import
        send(channel, {"ok": False, "error": describe_failure(exc)})
        return 0
    send(channel, first)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            answer = validate(config_cls, request.get("values"))
        except BaseException as exc:  # a validator may raise anything
            answer = {"ok": False, "error": describe_failure(exc)}
        send(channel, answer)
    return 0
