"""verifiers environments: folders written for these tests (envs/, in the style of the
verifiers repository's own: a pyproject.toml and a module), the interpreter they run in, and a
live server that finds them. Every test here is in the `verifiers` lane (tests/conftest.py;
`-m 'not verifiers'` leaves them out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.settings import Settings
from tests.support.live_server import LiveServer

ENVS = Path(__file__).parent / "envs"


@pytest.fixture(scope="session")
def verifiers_python() -> str:
    """The verifiers interpreter the set-up makes: these tests need it (no skipping: CI has
    it)."""
    python = Settings().verifiers_python
    assert Path(python).is_file(), (
        f"no verifiers interpreter at {python}: run `make install` (it makes .venv-verifiers), "
        "or leave these tests out with -m 'not verifiers'"
    )
    return python


def verifiers_server(var_dir: Path, *more_dirs: Path, **env: str) -> LiveServer:
    """A live server that lists the test environments (and those in `more_dirs`)."""
    dirs = json.dumps([str(ENVS), *(str(d) for d in more_dirs)])
    return LiveServer(var_dir, None, RLCS_ENV_DIRS=dirs, **env)


def publish(folder: Path, name: str, module: str, pyproject_extra: str = "") -> Path:
    """An environment folder as the verifiers repository publishes one: its pyproject.toml
    naming it and its module beside it."""
    where = folder / name.replace("-", "_")
    where.mkdir(parents=True, exist_ok=True)
    (where / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1.0"\n'
        f'dependencies = ["verifiers>=0.1.9"]\n{pyproject_extra}'
    )
    (where / f"{name.replace('-', '_')}.py").write_text(module)
    return where
