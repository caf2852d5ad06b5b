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


# Test lanes: a test's lane is the folder it sits in. Every test under a folder named here, at
# any depth below tests/ (tests/slow/, tests/cli/slow/, tests/backend/gpu/, ...), gets that lane:
# a marker registered in pyproject.toml, which `make test-fast` leaves out (all but gpu, which
# skips without CUDA). Tests outside them are fast.
LANE_OF_FOLDER = {
    "slow": "slow",  # over ~2.5 s on a loaded 2-core machine: live servers, workers, real waits
    "training": "training",  # trains a real model for steps (tiny-random, SmolLM2)
    "tinker_api": "slow",  # our server's Tinker API: the SDK against a live server and engine
    "browser": "browser",
    "atropos": "atropos",
    "ray": "ray",
    "install": "install",
    "postgres": "postgres",
    "gpu": "gpu",
}
LANES = frozenset(LANE_OF_FOLDER.values())
TESTS = Path(__file__).parent


def folder_lanes(item: pytest.Item) -> set[str]:
    folders = item.path.relative_to(TESTS).parts[:-1]
    return {LANE_OF_FOLDER[f] for f in folders if f in LANE_OF_FOLDER}


def on_postgres(item: pytest.Item) -> bool:
    """The one lane also set otherwise than by folder: one test function may run on SQLite and on
    PostgreSQL, so the tests that take the `postgres` fixture and the PostgreSQL side of those
    parametrized over both databases (param "postgresql", as `database_url` here and
    test_lifecycle's `engine` are) are in the `postgres` lane wherever they are."""
    callspec = getattr(item, "callspec", None)
    on_both = callspec is not None and "postgresql" in callspec.params.values()
    return on_both or "postgres" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)  # before other hooks read the lanes (the gpu skip, -m)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for lane in sorted(folder_lanes(item)):
            item.add_marker(lane)
        if on_postgres(item):
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
