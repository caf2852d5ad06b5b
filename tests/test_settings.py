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
