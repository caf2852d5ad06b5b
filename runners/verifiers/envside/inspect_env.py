"""The verifiers inspector: `<verifiers python> inspect_env.py MODULE_FILE ENTRY`, run by path in
the verifiers interpreter, in the environment's folder (nothing of the project imports here).
It imports the environment's module and describes its own config as the server's inspector
protocol asks (core.inspect_wire): v0, `load_environment`'s parameters (typed by their
annotations, else by their defaults); v1, its taskset config's and Env config's own fields
(rlcs_v1.py); then validates values as those types take them, strictly, and on a request to
`load`, loads the environment with them as a run's driver would (what a run could not start
with is a `failed` answer saying why).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import typing
from pathlib import Path
from typing import Any

V0_ENTRY = "load_environment"


def load_by_path(path: Path, name: str) -> Any:
    """A module of ours by its path: nothing of the project is importable here, and the
    project's root on sys.path could shadow the environment's own modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HERE = Path(__file__).resolve().parent
# The inspector protocol's stdlib side, and what the inspector and the driver share (v1).
protocol = load_by_path(HERE.parents[1] / "doors" / "envside" / "inspect_protocol.py", "rlcs_ip")
v1 = load_by_path(HERE / "rlcs_v1.py", "rlcs_v1")


def module_name(module_file: Path) -> str:
    """What verifiers imports the environment as (its id with `-` as `_`)."""
    return module_file.parent.name if module_file.name == "__init__.py" else module_file.stem


def load_entry(module_file: Path, entry: str) -> Any:
    """The module as verifiers imports it (its folder on sys.path, by its own name)."""
    package = module_file.name == "__init__.py"
    sys.path.insert(0, str(module_file.parent.parent if package else module_file.parent))
    module = importlib.import_module(module_name(module_file))
    found = getattr(module, entry, None)
    if found is None:
        raise ImportError(f"{module_file.name} defines no {entry}")
    return found


def parameter_fields(function: Any) -> dict[str, tuple[Any, Any]]:
    """`load_environment`'s named parameters as pydantic fields: (type, default)."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # an annotation that names what is not importable here
        hints = {}
    fields: dict[str, tuple[Any, Any]] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        default = parameter.default
        if default is inspect.Parameter.empty:
            default = ...
        elif not _json(default):
            continue  # a default only code can give (an object): not a config field
        annotation = hints.get(name)
        if annotation is None:
            annotation = Any if default in (..., None) else type(default)
        fields[name] = (annotation, default)
    return fields


def _json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


# Environments that run their rollouts in Prime's remote sandboxes (verifiers 0.3's classes).
REMOTE = ("SandboxEnv", "CliAgentEnv", "HarborEnv", "BrowserEnv")


class CannotUse(Exception):
    """Why a run could not use the environment, in words (no traceback place)."""


def load_checked(env_id: str, args: dict[str, Any]) -> None:
    """Load the environment as the driver does; raise why a run could not use it."""
    import verifiers as vf

    try:
        env = vf.load_environment(env_id, **args)
    except vf.MissingKeyError as exc:
        raise CannotUse(
            f"it needs an API key the server does not give environments ({exc})"
        ) from None
    remote = [c.__name__ for c in type(env).__mro__ if c.__name__ in REMOTE]
    if remote:
        raise CannotUse(
            f"it is a {remote[0]}: its rollouts run in Prime's remote sandboxes, which this "
            "server does not reach"
        )
    if len(env.get_dataset()) < 1:
        raise CannotUse("its dataset is empty")


def describe_v0(function: Any, env_id: str) -> tuple[dict[str, Any], Any]:
    """v0: `load_environment`'s parameters; a load is `load_environment(**args)`."""
    doc = (inspect.getdoc(function) or "").split("\n\n")[0] or None
    return describe(parameter_fields(function), doc, lambda args: load_checked(env_id, args))


def describe_v1(module_file: Path) -> tuple[dict[str, Any], Any]:
    """v1: its taskset config's own fields and its Env config's, by name, with the defaults
    its config gives; a load builds its Env (every role on the subprocess runtime with the
    null harness) and its tasks."""
    module = module_name(module_file)
    package = module_file.name == "__init__.py"
    sys.path.insert(0, str(module_file.parent.parent if package else module_file.parent))
    config = v1.base_config(module)
    taskset_fields, env_fields = v1.own_fields(config)
    defaults = {
        **config.model_dump(mode="json", include=set(env_fields)),
        **config.taskset.model_dump(mode="json", include=set(taskset_fields)),
    }
    fields = {
        name: (info.annotation, defaults[name])
        for name, info in {**env_fields, **taskset_fields}.items()
        if name in defaults and _json(defaults[name])
    }
    doc = (type(config.taskset).__doc__ or "").strip().split("\n\n")[0] or None

    def load(args: dict[str, Any]) -> None:
        import verifiers.v1 as vf

        env = vf.load_environment(v1.run_config(module, args))
        if v1.first_task(env.taskset) is None:
            raise CannotUse("its taskset has no tasks")

    return describe(fields, doc, load, locked={"runtime": "subprocess", "harness": "null"})


def describe(
    fields: dict[str, tuple[Any, Any]],
    doc: str | None,
    load: Any,
    locked: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Any]:
    """The first answer for `fields` (type, default each), and the answerer of requests:
    values validated strictly; with `load`, the environment loaded with them (once per
    arguments); `locked`: what the server fixes, shown with every answer."""
    from pydantic import ConfigDict, create_model

    model = create_model(  # type: ignore[call-overload]
        "EnvArgs", __config__=ConfigDict(extra="forbid"), **fields
    )
    model.__doc__ = doc
    defaults = {k: v for k, (_, v) in fields.items() if v is not ...}
    fixed = dict(locked or {})
    first = {
        "kind": "described",
        "fields": sorted(fields),
        "schema": model.model_json_schema(),
        "defaults": defaults,
        "locked": sorted(fixed),
    }
    loaded: dict[str, dict[str, Any]] = {}  # arguments (as JSON) -> the answer to a load

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        reply = validate(model, defaults, dict(request.get("values") or {}))
        if reply["kind"] == "validated":
            reply["values"].update(fixed)
        if reply["kind"] != "validated" or not request.get("load"):
            return reply
        key = json.dumps(reply["values"], sort_keys=True)
        if key not in loaded:
            args = {k: v for k, v in reply["values"].items() if k not in fixed}
            try:
                load(args)
                loaded[key] = reply
            except CannotUse as exc:
                loaded[key] = {"kind": "failed", "error": str(exc)}
            except BaseException as exc:  # the environment's own code: anything
                loaded[key] = protocol.failed(exc)
        return loaded[key]

    return first, answer


def validate(model: Any, defaults: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """`values` over the defaults: the given values strictly (JSON types, no coercion from
    strings); the answer holds every field."""
    from pydantic import ValidationError

    try:
        valid = model.model_validate_json(json.dumps({**defaults, **values}), strict=True)
    except ValidationError as exc:
        errors = [protocol.plain_error(e) for e in exc.errors(include_url=False)]
        return {"kind": "invalid", "errors": errors}
    return {"kind": "validated", "values": valid.model_dump(mode="json")}


def main(argv: list[str]) -> int:
    module_file, entry = Path(argv[0]).resolve(), argv[1]

    def describe_file() -> tuple[dict[str, Any], Any]:
        if entry != V0_ENTRY:
            return describe_v1(module_file)
        return describe_v0(load_entry(module_file, entry), module_name(module_file))

    return int(protocol.serve(describe_file))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
