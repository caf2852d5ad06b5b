"""Atropos environments: the environment files written for these tests (envs/, in the style of
Atropos's own), the interpreter they run in, and a live server that finds them. Every test
here is in the `atropos` lane (tests/conftest.py; `-m 'not atropos'` leaves them out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.settings import Settings
from tests.support.live_server import LiveServer

ENVS = Path(__file__).parent / "envs"


@pytest.fixture(scope="session")
def atropos_python() -> str:
    """The Atropos interpreter the set-up makes: these tests need it (no skipping: CI has it)."""
    python = Settings().atropos_python
    assert Path(python).is_file(), (
        f"no Atropos interpreter at {python}: run `make install` (it makes .venv-atropos), "
        "or leave these tests out with -m 'not atropos'"
    )
    return python


def atropos_server(var_dir: Path, *more_dirs: Path, **env: str) -> LiveServer:
    """A live server that lists the test environments (and those in `more_dirs`)."""
    dirs = json.dumps([str(ENVS), *(str(d) for d in more_dirs)])
    return LiveServer(var_dir, None, RLCS_ENV_DIRS=dirs, **env)
