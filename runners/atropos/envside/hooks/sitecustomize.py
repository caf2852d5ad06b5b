"""Loaded by every Atropos process the runner or the inference worker starts (this folder is
on its PYTHONPATH; stdlib only). The environment's code and atroposlib stay as written; this
only watches them from inside the same process:

- RLCS_ATROPOS_PARENT_PID: when that process (the runner) is gone, however it ended (kill -9
  included), this process ends its whole process group, so nothing of a run outlives it;
- RLCS_ATROPOS_METRICS_FILE: what the environment logs to W&B (`wandb.log`, after
  `wandb.init`) is also appended to that file as JSON lines {"step", "metrics"}, numbers only,
  for the runner to put into the run's history.

It does nothing in any other process (these variables are unset there).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

PARENT_VARIABLE = "RLCS_ATROPOS_PARENT_PID"
METRICS_VARIABLE = "RLCS_ATROPOS_METRICS_FILE"


def _watch_parent(parent: int, every_s: float = 0.5) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="rlcs-parent-watch").start()


def _numbers(data: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    if not isinstance(data, dict):
        return out
    for key, value in data.items():
        if isinstance(value, bool | int | float):
            out[str(key)] = float(value)
        elif type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
            out[str(key)] = float(value)  # numpy scalars (np.mean, np.std)
    return out


def _tapped(log: Callable[..., Any], path: str) -> Callable[..., Any]:
    def log_and_copy(data: Any = None, step: int | None = None, *args: Any, **kwargs: Any) -> Any:
        try:
            numbers = _numbers(data)
            if numbers:
                with open(path, "a", encoding="utf-8") as out:
                    out.write(json.dumps({"step": step, "metrics": numbers}) + "\n")
        except Exception:  # the copy must never break the environment's logging
            pass
        return log(data, step, *args, **kwargs)

    return log_and_copy


def _patch_wandb(wandb: Any, path: str) -> None:
    """wandb.init rebinds wandb.log to the new run's; wrap each one it binds."""
    original_init = wandb.init

    def init(*args: Any, **kwargs: Any) -> Any:
        run = original_init(*args, **kwargs)
        wandb.log = _tapped(wandb.log, path)
        return run

    wandb.init = init


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches wandb the moment it is first imported (importing it here would cost seconds
    in processes that never use it)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "wandb":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module
        metrics_path = self.path

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _patch_wandb(module, metrics_path)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    # Popped: a process this one starts (same interpreter, same hook) has another parent, and
    # watching for ours would make it kill the group at once. Our group's end takes it along.
    parent = os.environ.pop(PARENT_VARIABLE, None)
    if parent and parent.isdigit():
        _watch_parent(int(parent))
    metrics = os.environ.get(METRICS_VARIABLE)
    if metrics:
        sys.meta_path.insert(0, _AfterImport(metrics))


_install()
