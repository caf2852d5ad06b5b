"""The Atropos inspector: `<atropos python> inspect_env.py FILE CLASS`, run by path in the
Atropos interpreter (stdlib, pydantic and atroposlib only: nothing of the project imports
there), in the file's folder. It imports one Atropos environment file in a process of its own
and answers questions about the config its `config_init()` gives, as the server's inspector
protocol asks (core.inspect_wire): a first line describing the config (or the import error),
then one JSON answer per JSON request line. What the file prints goes nowhere.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

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
        "kind": "described",
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
            protocol.plain_error(e)
            for e in exc.errors(include_url=False)
            if not e.get("loc") or e["loc"][0] in values
        ]
        if errors:
            return {"kind": "invalid", "errors": errors}
    try:
        merged = config_cls.model_validate({**config.model_dump(), **values})
    except ValidationError as exc:
        errors = [protocol.plain_error(e) for e in exc.errors(include_url=False)]
        return {"kind": "invalid", "errors": errors}
    return {"kind": "validated", "values": merged.model_dump(mode="json")}


def load_protocol() -> Any:
    """runners/doors/envside/inspect_protocol.py (stdlib only), loaded by path: nothing of the
    project is importable in this interpreter, and the project's root on sys.path could shadow
    the environment's own modules (Atropos has an `environments` package too)."""
    path = Path(__file__).resolve().parents[2] / "doors" / "envside" / "inspect_protocol.py"
    spec = importlib.util.spec_from_file_location("rlcs_inspector_protocol", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


protocol = load_protocol()


def main(argv: list[str]) -> int:
    path, class_name = Path(argv[0]).resolve(), argv[1]

    def describe_file() -> tuple[dict[str, Any], Any]:
        folder = tempfile.mkdtemp(prefix="rlcs-inspect-")
        yaml_path = Path(folder) / "config.yaml"
        yaml_path.write_text(json.dumps(INSPECTION_YAML))  # JSON is YAML too
        sys.argv = [str(path), "serve", "--config", str(yaml_path)]
        try:
            config, servers = load_class(path, class_name).config_init()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return describe(config, servers), lambda request: validate(
            config, dict(request.get("values") or {})
        )

    return int(protocol.serve(describe_file))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
