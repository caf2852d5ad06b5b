"""Settings for a server in a test: a file database and every folder under one tmp folder, no
service keys, a fast supervisor."""

from __future__ import annotations

from pathlib import Path

from core.settings import Settings


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "var_dir": tmp_path / "var",
        "tinker_api_key": None,
        "wandb_api_key": None,
        "openreward_api_key": None,
        "api_token": None,
        "supervisor_interval_s": 0.1,
        "stop_grace_s": 3.0,
        # Tests that want a warm worker ask for it; others must not load SmolLM2 at start-up.
        "inference_warmup": False,
        # An engine host a test started ends soon after its last client (tests/conftest.py
        # stops the ones still there after each test).
        "engine_idle_s": 60.0,
        # Starlette's TestClient names its host `testserver`; live servers use 127.0.0.1.
        "allowed_hosts": ["testserver", "127.0.0.1", "localhost"],
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]
