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
from tests.support.engine_hosts import stop_engine_hosts

# A real PostgreSQL for the tests that ask for it (started once per session, on first use).
from tests.support.postgres import PostgresServer, postgres, postgres_url  # noqa: F401
from tests.support.settings import make_settings

# Tests never talk to hosted services; the runner and worker inherit these.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _engine_hosts_end(request: pytest.FixtureRequest) -> Iterator[None]:
    """An engine host outlives the server or run that started it, by design: the ones a test
    started under its tmp_path are stopped after it (and any left, at the session's end)."""
    # Asked for now, so that tmp_path is torn down after this fixture, not before it.
    folder = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if folder is not None:
        stop_engine_hosts(folder)


@pytest.fixture(scope="session", autouse=True)
def _engine_hosts_end_with_the_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    yield
    stop_engine_hosts(tmp_path_factory.getbasetemp())


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
# skips without CUDA). Tests outside them are fast. A test carries no lane marker of its own:
# collection stops on one, saying where the test goes (docs/developers.md, "Test lanes").
LANE_OF_FOLDER = {
    "slow": "slow",  # over ~2.5 s on a loaded 2-core machine: live servers, workers, real waits
    "training": "training",  # trains a real model for steps (tiny-random, SmolLM2)
    "tinker_api": "slow",  # our server's Tinker API: the SDK against a live server and engine
    "browser": "browser",
    "atropos": "atropos",
    "verifiers": "verifiers",
    "ray": "ray",
    "install": "install",
    "postgres": "postgres",
    "gpu": "gpu",
}
LANES = frozenset(LANE_OF_FOLDER.values())
# Where a test with lane markers of its own belongs, when they name several: the first listed.
PRECEDENCE = (
    "gpu",
    "install",
    "ray",
    "browser",
    "atropos",
    "verifiers",
    "postgres",
    "training",
    "slow",
)
# Folders that are a domain and a lane at once: a test there is in their lane, however marked.
DOMAIN_LANE_FOLDERS = {"browser", "atropos", "verifiers", "tinker_api"}
TESTS = Path(__file__).parent


def folders(item: pytest.Item) -> tuple[str, ...]:
    """The folders between tests/ and the test's module (none for a test outside tests/)."""
    return item.path.relative_to(TESTS).parts[:-1] if item.path.is_relative_to(TESTS) else ()


def folder_lanes(item: pytest.Item) -> set[str]:
    return {LANE_OF_FOLDER[f] for f in folders(item) if f in LANE_OF_FOLDER}


def on_postgres(item: pytest.Item) -> bool:
    """The one lane also set otherwise than by folder: one test function may run on SQLite and on
    PostgreSQL, so the tests that take the `postgres` fixture and the PostgreSQL side of those
    parametrized over both databases (param "postgresql", as `database_url` here and
    test_lifecycle's `engine` are) are in the `postgres` lane wherever they are."""
    callspec = getattr(item, "callspec", None)
    on_both = callspec is not None and "postgresql" in callspec.params.values()
    return on_both or "postgres" in getattr(item, "fixturenames", ())


def lane_home(item: pytest.Item, lane: str) -> str:
    """The folder a test of `lane` belongs in: the lane folder beside the test's own domain
    folder (tests/slow/ for tests/test_runs.py, tests/cli/slow/ for tests/cli/test_cli.py)."""
    if lane in DOMAIN_LANE_FOLDERS:
        return f"tests/{lane}/"
    domain = [f for f in folders(item) if f not in LANE_OF_FOLDER]
    return "/".join(["tests", *domain, lane]) + "/"


def misplaced(item: pytest.Item) -> str | None:
    """Why `item` is refused, if it carries a lane marker of its own (its module's pytestmark,
    a decorator, a pytest.param's marks): lanes are set by folder only."""
    own = {m.name for m in item.iter_markers() if m.name in LANES}
    if not own:
        return None
    where = f"{item.nodeid} is marked {', '.join(sorted(own))}"
    given = folder_lanes(item) | ({"postgres"} if on_postgres(item) else set())
    if own <= given or DOMAIN_LANE_FOLDERS.intersection(folders(item)):
        return f"{where}: drop the marker; where it is gives its lane ({', '.join(sorted(given))})"
    lane = next(lane for lane in PRECEDENCE if lane in own - given)
    fix = f"move it to {lane_home(item, lane)}{item.path.name}"
    if lane == "postgres":
        fix = "take the `postgres` fixture, or " + fix
    return f"{where}: {fix} and drop the marker"


@pytest.hookimpl(tryfirst=True)  # before other hooks read the lanes (the gpu skip, -m)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    refused = [why for item in items if (why := misplaced(item)) is not None]
    if refused:
        raise pytest.UsageError(
            "a test's lane is its folder (tests/conftest.py, LANE_OF_FOLDER), never a marker "
            "of its own; a test moved to a lane folder keeps its name, its module's name, and "
            "the fixtures it shares (docs/developers.md, Test lanes):\n  " + "\n  ".join(refused)
        )
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
