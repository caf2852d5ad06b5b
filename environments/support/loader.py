"""Import an environment class from its file, the same way in the server, runner and worker."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from environments.base import BaseEnv

_PACKAGE_DIR = Path(__file__).resolve().parent


def load_env_class(path: Path, class_name: str) -> type[BaseEnv]:
    """Import `path` and return its `class_name`, which must derive from BaseEnv.

    Files of this package import under their usual names (`environments.x`); files from
    other folders under a name derived from their path, so two folders cannot collide.
    """
    module = _import(path.resolve())
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, BaseEnv):
        raise ImportError(f"{path.name} has no BaseEnv subclass named {class_name}")
    return cls


def _import(path: Path) -> ModuleType:
    if path.parent == _PACKAGE_DIR:
        name = f"environments.{path.stem}"
        module = sys.modules.get(name)
        if module is None:
            module = importlib.import_module(name)
        elif _stale(module, path):
            module = importlib.reload(module)
        module.__dict__["__rlcs_mtime__"] = path.stat().st_mtime
        return module
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"rlcs_env_{digest}_{path.stem}"
    module = sys.modules.get(name)
    if module is not None and not _stale(module, path):
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    # Registered before executing so pydantic and dataclasses can resolve the module.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    module.__dict__["__rlcs_mtime__"] = path.stat().st_mtime
    return module


def _stale(module: ModuleType, path: Path) -> bool:
    loaded = module.__dict__.get("__rlcs_mtime__")
    return loaded is not None and path.stat().st_mtime != loaded
