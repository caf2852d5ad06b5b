"""Settings as a user writes them in the environment: the forms each one takes, and one line
(not a traceback) when a value cannot be read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import Settings


@pytest.mark.parametrize(
    ("written", "folders"),
    [
        ("/srv/envs", ["/srv/envs"]),
        ("/srv/envs:/home/me/atropos-envs", ["/srv/envs", "/home/me/atropos-envs"]),
        ('["/srv/envs", "/x y"]', ["/srv/envs", "/x y"]),
        ("", []),
    ],
)
def test_environment_folders_as_path_or_json(
    monkeypatch: pytest.MonkeyPatch, written: str, folders: list[str]
) -> None:
    monkeypatch.setenv("RLCS_ENV_DIRS", written)
    assert Settings().env_dirs == [Path(f) for f in folders]


def test_unreadable_environment_folders_stop_the_server_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "RLCS_VAR_DIR": str(tmp_path), "RLCS_ENV_DIRS": '["/srv/envs"'}
    done = subprocess.run(
        [sys.executable, "-m", "server"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "RLCS_ENV_DIRS is not a JSON list" in lines[0], done.stderr


def test_a_process_without_the_database_layer_reads_its_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run's process or an engine host on a bare GPU image gets the server's database URL in
    its environment but has no sqlalchemy: the URL is kept unchecked (it opens no database),
    where with sqlalchemy a bad URL is still refused."""
    monkeypatch.setenv("RLCS_DATABASE_URL", "not a url")
    with pytest.raises(ValueError, match="not a database URL"):
        Settings()
    for name in ("sqlalchemy", "sqlalchemy.engine", "sqlalchemy.exc"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` of it raises ImportError
    assert Settings().database_url == "not a url"
