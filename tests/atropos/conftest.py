"""Atropos environments: the environment files written for these tests (envs/, in the style of
Atropos's own), the interpreter they run in, and a live server that finds them. Every test
here is marked `atropos` (`-m 'not atropos'` leaves them out)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.settings import Settings
from tests.live_server import LiveServer

ENVS = Path(__file__).parent / "envs"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.atropos)


@pytest.fixture(scope="session")
def atropos_python() -> str:
    """The Atropos interpreter the set-up makes: these tests need it (no skipping: CI has it)."""
    python = Settings().atropos_python
    assert Path(python).is_file(), (
        f"no Atropos interpreter at {python}: run `make install` (it makes .venv-atropos), "
        "or leave these tests out with -m 'not atropos'"
    )
    return python


def atropos_server(var_dir: Path, **env: str) -> LiveServer:
    """A live server that lists the test environments (RLCS_ENV_DIRS)."""
    return LiveServer(var_dir, RLCS_ENV_DIRS=json.dumps([str(ENVS)]), **env)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, atropos_python: str) -> Iterator[LiveServer]:
    """One server for a module's runs (several at once: most of a short run is waiting)."""
    var = tmp_path_factory.mktemp("atropos") / "var"
    with atropos_server(
        var,
        RLCS_MAX_CONCURRENT_RUNS="4",
        RLCS_ATROPOS_STALL_S="20",
        RLCS_STOP_GRACE_S="20",
    ) as server:
        yield server
