"""The inspector protocol's side in the Atropos and verifiers inspectors (their inspect_env.py),
stdlib only: their interpreters have nothing of the project, so it writes the JSON of
core.inspect_wire's models itself (a test holds the two together). A first line describes the
config (or the import error), then one JSON answer per request line. Ours uses core.child's
LineChannel instead.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

PARENT_PID_VARIABLE = "RLCS_PARENT_PID"  # as core.procs names it (core is not importable here)

Message = dict[str, Any]


def plain_error(err: Any) -> Message:
    """A pydantic validation error with only JSON in it (`ctx` may hold exception objects)."""
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


def send(channel: TextIO, answer: Message) -> None:
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


def serve(describe: Callable[[], tuple[Message, Callable[[Message], Message]]]) -> int:
    """The whole exchange: `describe()` imports the file and gives the first line (a
    "described" answer) and the answerer of requests ({"values": ...} in, a "validated" or
    "invalid" answer out); what the file raises, at import or later, is a "failed" answer."""
    exit_with_parent()
    channel = private_stdout()
    try:
        first, answer = describe()
    except BaseException as exc:  # SystemExit and all: user code runs at import
        send(channel, failed(exc))
        return 0
    send(channel, first)
    for line in sys.stdin:
        try:
            reply = answer(json.loads(line))
        except BaseException as exc:  # a validator may raise anything
            reply = failed(exc)
        send(channel, reply)
    return 0


def failed(exc: BaseException) -> Message:
    return {"kind": "failed", "error": describe_failure(exc)}
