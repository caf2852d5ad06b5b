"""verifiers environments are found as published (a folder with a pyproject.toml depending on
verifiers, its module beside it), read as TOML and AST only: each generation told apart, and a
folder that cannot be used listed with why."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from server.app import create_app
from server.environments import discovery
from tests.support.settings import make_settings
from tests.verifiers.conftest import ENVS, publish

V1 = '''"""Count the vowels of a word: a v1 taskset."""
import verifiers.v1 as vf


class VowelTaskset(vf.Taskset):
    pass
'''
V1_FROM = """from verifiers.v1 import Taskset as Base


class Vowels(Base):
    pass
"""


def test_each_generation_is_told_apart(tmp_path: Path) -> None:
    publish(tmp_path, "vowels", V1)
    publish(tmp_path, "vowels-from", V1_FROM)
    found = {f.name: f for f in discovery.scan([ENVS, tmp_path])}
    reverse = found["reverse-word"]
    assert (reverse.framework, reverse.generation, reverse.class_name) == (
        "verifiers",
        "v0",
        "load_environment",
    )
    assert reverse.path == ENVS / "reverse_word" / "reverse_word.py"
    assert reverse.description.startswith("Reverse a word")  # the pyproject's description
    assert found["word-chain"].generation == "v0"
    assert (found["vowels"].generation, found["vowels"].class_name) == ("v1", "VowelTaskset")
    assert found["vowels"].description == "Count the vowels of a word: a v1 taskset."
    assert (found["vowels-from"].generation, found["vowels-from"].class_name) == ("v1", "Vowels")


def test_a_v1_package_is_found_as_published_today(tmp_path: Path) -> None:
    """The repository's v1 layout: a package whose __init__ re-exports the taskset from a
    module of its own, a generic Taskset base, and a pyproject without verifiers."""
    folder = tmp_path / "reverse_chars"
    (folder / "reverse_chars").mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "reverse-chars"\ndescription = "Reverse characters."\n'
        'dependencies = ["datasets"]\n'
    )
    (folder / "reverse_chars" / "__init__.py").write_text(
        'from reverse_chars.taskset import CharsTaskset\n\n__all__ = ["CharsTaskset"]\n'
    )
    (folder / "reverse_chars" / "taskset.py").write_text(
        "import verifiers.v1 as vf\n\n\n"
        "class CharsTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):\n    pass\n"
    )
    (found,) = discovery.scan([tmp_path])
    assert (found.name, found.generation, found.class_name) == (
        "reverse-chars",
        "v1",
        "CharsTaskset",
    )
    assert found.path == folder / "reverse_chars" / "__init__.py"
    assert found.description == "Reverse characters."


def test_a_folder_that_cannot_be_used_is_listed_with_why(tmp_path: Path) -> None:
    publish(tmp_path, "no-entry", "def helper():\n    return 1\n")
    publish(tmp_path, "broken", "def load_environment(:\n")
    missing = publish(tmp_path, "missing-module", "")
    (missing / "missing_module.py").unlink()
    settings = make_settings(tmp_path / "var", env_dirs=[tmp_path])
    with TestClient(create_app(settings)) as client:
        listed = {e["name"]: e for e in client.get("/environments").json()}
        assert listed["no-entry"]["importable"] is False
        assert (
            "neither load_environment (v0) nor a verifiers.v1 Taskset"
            in listed["no-entry"]["error"]
        )
        assert listed["broken"]["error"].startswith("SyntaxError")
        assert "no module missing_module.py" in listed["missing-module"]["error"]
        assert {listed[n]["framework"] for n in ("no-entry", "broken", "missing-module")} == {
            "verifiers"
        }
        refused = client.post("/environments/broken/select")
        assert refused.status_code == 409 and "SyntaxError" in refused.json()["detail"]


def test_other_projects_are_not_verifiers_environments(tmp_path: Path) -> None:
    other = tmp_path / "tool"
    other.mkdir()
    (other / "pyproject.toml").write_text('[project]\nname = "tool"\ndependencies = []\n')
    (other / "tool.py").write_text("def load_environment():\n    return None\n")
    assert [f.name for f in discovery.scan([tmp_path])] == []
