"""The Atropos inspector: `<atropos python> inspect_env.py FILE CLASS`, run by path in the
Atropos interpreter (stdlib, pydantic and atroposlib only: nothing of the project imports
there), in the file's folder. It imports one Atropos environment file in a process of its own
and answers questions about the config its `config_init()` gives, as the server's inspector
protocol asks (server.environments.inspector): a first line describing the config (or the
import error), then one JSON answer per JSON request line. What the file prints goes nowhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

PARENT_PID_VARIABLE = "RLCS_PARENT_PID"  # as core.procs names it


# What a run's YAML says of the servers, for config_init()s that read the --config file
# themselves (letter_counting builds its servers from it, and needs their server_type).
INSPECTION_YAML = {
    "env": {},
    "openai": [
        {
            "model_name": "inspection",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key": "x",
            "server_type": "sglang",
            "health_check": False,
        }
    ]
    * 2,
    "slurm": False,
    "testing": False,
}


def load_class(path: Path, class_name: str) -> Any:
    """Import the file as its own module (its folder first on sys.path, and `--config YAML` in
    sys.argv, as `python FILE serve --config YAML` has them in a run) and return the class,
    which must derive from atroposlib's BaseEnv."""
    from atroposlib.envs.base import BaseEnv

    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, BaseEnv):
        raise ImportError(f"{path.name} has no atroposlib BaseEnv subclass named {class_name}")
    return cls


def describe(config: Any, servers: Any) -> dict[str, Any]:
    listed = servers if isinstance(servers, list) else [servers]
    return {
        "ok": True,
        "fields": sorted(type(config).model_fields),
        "schema": type(config).model_json_schema(),
        "defaults": config.model_dump(mode="json"),
        "servers": {
            "count": len(listed),
            "kind": type(listed[0]).__name__ if listed else None,
            "server_type": getattr(listed[0], "server_type", None) if listed else None,
        },
    }


def validate(config: Any, values: dict[str, Any]) -> dict[str, Any]:
    """`values` over the config_init() config: the given values strictly (JSON types, no
    coercion from strings), the defaults as they are."""
    from pydantic import ValidationError

    config_cls = type(config)
    defaults = config.model_dump(mode="json")
    try:
        config_cls.model_validate_json(json.dumps({**defaults, **values}), strict=True)
    except ValidationError as exc:
        errors = [
            _plain(e)
            for e in exc.errors(include_url=False)
            if not e.get("loc") or e["loc"][0] in values
        ]
        if errors:
            return {"ok": False, "errors": errors}
    try:
        merged = config_cls.model_validate({**config.model_dump(), **values})
    except ValidationError as exc:
        return {"ok": False, "errors": [_plain(e) for e in exc.errors(include_url=False)]}
    return {"ok": True, "values": merged.model_dump(mode="json")}


def _plain(err: Any) -> dict[str, Any]:
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
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    return channel


def send(channel: TextIO, answer: dict[str, Any]) -> None:
    channel.write(json.dumps(answer) + "\n")
    channel.flush()


def exit_with_parent(every_s: float = 0.5) -> None:
    parent = int(os.environ.get(PARENT_PID_VARIABLE) or os.getppid())

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def main(argv: list[str]) -> int:
    path, class_name = Path(argv[0]).resolve(), argv[1]
    exit_with_parent()
    channel = private_stdout()
    folder = tempfile.mkdtemp(prefix="rlcs-inspect-")
    yaml_path = Path(folder) / "config.yaml"
    yaml_path.write_text(json.dumps(INSPECTION_YAML))  # JSON is YAML too
    sys.argv = [str(path), "serve", "--config", str(yaml_path)]
    try:
        config, servers = load_class(path, class_name).config_init()
        first = describe(config, servers)
    except BaseException as exc:  # SystemExit and all: user code runs at import
        send(channel, {"ok": False, "error": describe_failure(exc)})
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    send(channel, first)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            answer = validate(config, dict(request.get("values") or {}))
        except BaseException as exc:
            answer = {"ok": False, "error": describe_failure(exc)}
        send(channel, answer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
