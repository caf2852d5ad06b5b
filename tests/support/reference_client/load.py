"""The reference client loaded as its users load it (a fresh import, pointed at a server by
RL_API_URL), its code unchanged, and its async tools called and timed."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CLIENT_FILE = Path(__file__).with_name("rl_training_tool.py")
CLIENT_TIMEOUT_S = 30  # _make_request's default, which every tool call uses


def load_client(monkeypatch: pytest.MonkeyPatch, url: str) -> ModuleType:
    """A fresh import of the client module: it reads RL_API_URL once, at import."""
    monkeypatch.setenv("RL_API_URL", url)
    spec = importlib.util.spec_from_file_location(f"rl_training_tool_{time.time_ns()}", CLIENT_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call(tool: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Run one of the client's async tools; its JSON answer and how long it took."""
    started = time.monotonic()
    answer = json.loads(asyncio.run(tool(*args, **kwargs)))
    return answer, time.monotonic() - started
