"""Shared fixtures: settings with a file database under tmp_path, and a live TestClient."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from core.settings import PROJECT_ROOT, Settings
from server.app import create_app

# A real PostgreSQL for the tests that ask for it (started once per session, on first use).
from tests.support.postgres import PostgresServer, postgres, postgres_url  # noqa: F401
from tests.support.settings import make_settings

# Tests never talk to hosted services; the runner and worker inherit these.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def prepared_models_dir() -> Path:
    """The models folder as the set-up leaves it (`make install` runs the same command):
    SmolLM2 converted from its GGUF, so a new server only has to load it."""
    folder = PROJECT_ROOT / "var" / "models"
    env = {**os.environ, "RLCS_MODELS_DIR": str(folder)}
    subprocess.run(
        [sys.executable, "-m", "runners.models.prepare"],
        cwd=PROJECT_ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return folder


# Test lanes (markers registered in pyproject.toml; `make test-fast` leaves these out): a folder
# whose tests are all of one kind, and tests on a real PostgreSQL: those that take the `postgres`
# fixture, and the PostgreSQL side of those parametrized over both databases (param "postgresql",
# as `database_url` here and test_lifecycle's `engine` are).
FOLDER_LANES = {"browser": "browser"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        lane = FOLDER_LANES.get(item.path.parent.name)
        if lane is not None:
            item.add_marker(lane)
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and "postgresql" in callspec.params.values()
        if on_postgres or "postgres" in getattr(item, "fixturenames", ()):
            item.add_marker("postgres")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind: the tests that take it run against both."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'rlcs.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database()
