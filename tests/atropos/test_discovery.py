"""Discovery tells the two kinds of environment apart by where their BaseEnv comes from, still
without importing anything; each listed environment says its framework."""

from __future__ import annotations

import textwrap
from pathlib import Path

from fastapi.testclient import TestClient

from server.app import create_app
from server.environments import discovery
from tests.atropos.conftest import ENVS
from tests.support.settings import make_settings

ATROPOS_FILE = '''
"""An Atropos environment: its module docstring describes it."""
from atroposlib.envs.base import BaseEnv, BaseEnvConfig

class MyConfig(BaseEnvConfig):
    x: int = 1

class PuzzleEnv(BaseEnv):
    name = "puzzle"

if __name__ == "__main__":
    PuzzleEnv.cli()
'''


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def found(folder: Path) -> dict[str, tuple[str, str | None, str]]:
    return {f.name: (f.framework, f.class_name, f.path.name) for f in discovery.scan([folder])}


def test_where_base_env_comes_from_says_the_kind(tmp_path: Path) -> None:
    write(tmp_path / "puzzle_env.py", ATROPOS_FILE)
    write(
        tmp_path / "aliased.py",
        """
        import atroposlib.envs.base as atropos_base
        class Aliased(atropos_base.BaseEnv):
            pass
        """,
    )
    write(
        tmp_path / "ours.py",
        """
        '''Ours.'''
        from environments.base import SingleTurnEnv
        class Ours(SingleTurnEnv):
            '''One of ours.'''
        """,
    )
    write(
        tmp_path / "derived.py",
        """
        from puzzle_env import PuzzleEnv
        class HarderPuzzle(PuzzleEnv):
            name = "harder_puzzle"
        """,
    )
    listed = found(tmp_path)
    assert listed == {
        "puzzle": ("atropos", "PuzzleEnv", "puzzle_env.py"),
        "aliased": ("atropos", "Aliased", "aliased.py"),
        "ours": ("rlcs", "Ours", "ours.py"),
        "harder_puzzle": ("atropos", "HarderPuzzle", "derived.py"),
    }
    puzzle = next(f for f in discovery.scan([tmp_path]) if f.name == "puzzle")
    assert puzzle.description == "An Atropos environment: its module docstring describes it."


def test_atropos_folders_are_found_one_level_down_and_their_helpers_ignored(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "puzzle_environment"
    write(folder / "puzzle_env.py", ATROPOS_FILE)
    write(folder / "helpers.py", "def solve():\n    return 1\n")
    write(folder / "config.yaml", "env:\n  group_size: 4\n")
    # One of ours in a subfolder is a helper module there, as environments/support/ holds.
    write(
        tmp_path / "support" / "base_like.py",
        "from environments.base import BaseEnv\nclass Helper(BaseEnv):\n    pass\n",
    )
    write(tmp_path / ".hidden" / "x.py", ATROPOS_FILE.replace("puzzle", "hidden"))
    assert found(tmp_path) == {"puzzle": ("atropos", "PuzzleEnv", "puzzle_env.py")}


def test_the_listing_says_each_environments_framework(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, env_dirs=[ENVS])
    with TestClient(create_app(settings)) as client:
        listed = {e["name"]: e for e in client.get("/environments").json()}
    kinds = {name: e["framework"] for name, e in listed.items()}
    for name in ("word_echo", "chat_dialogue", "counting", "flat_scores"):
        assert kinds[name] == "atropos"
        assert listed[name]["importable"] is None  # listing imports nothing
    assert kinds["arithmetic"] == "rlcs" and kinds["repeat_word"] == "rlcs"
    assert "base" not in listed  # environments/base.py holds the root classes only
    assert listed["word_echo"]["file_path"].endswith("envs/word_echo/word_echo_env.py")
