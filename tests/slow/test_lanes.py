"""Test lanes are folders (tests/conftest.py): in a copy of the tests' root, modules planted with
lane markers of their own stop collection, each named with the folder it belongs in; and
modules in lane folders, nested ones included, are in their lane (`-m` leaves them out)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import PROJECT_ROOT

MARKED = {
    "test_planted.py": """
import pytest

@pytest.mark.slow
def test_decorated():
    pass

@pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.training)])
def test_param(x):
    pass
""",
    "cli/test_planted.py": """
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

def test_module_marked():
    pass
""",
    "slow/test_planted.py": """
import pytest

@pytest.mark.slow
def test_in_its_folder():
    pass
""",
    "browser/test_planted.py": """
import pytest

@pytest.mark.training
def test_elsewhere():
    pass
""",
}
UNMARKED = {
    "test_plain.py": "def test_fast():\n    pass\n",
    "cli/slow/test_plain.py": "def test_nested():\n    pass\n",
    "tinker_api/test_plain.py": "def test_tinker_api():\n    pass\n",
    "training/test_plain.py": "def test_trains(database_url):\n    pass\n",
}


def planted_tree(tmp_path: Path, modules: dict[str, str]) -> Path:
    """The tests' root conftest and support code with `modules` beside them, under tmp_path."""
    tests = tmp_path / "tests"
    shutil.copytree(
        PROJECT_ROOT / "tests" / "support",
        tests / "support",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("__init__.py", "conftest.py"):
        shutil.copy2(PROJECT_ROOT / "tests" / name, tests / name)
    shutil.copy2(PROJECT_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")  # the markers
    for name, text in modules.items():
        path = tests / name
        for folder in reversed(path.relative_to(tests).parents[:-1]):
            (tests / folder).mkdir(exist_ok=True)
            (tests / folder / "__init__.py").touch()
        path.write_text(text)
    return tmp_path


def collect(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}  # ours; `tests` is the copy's
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_lane_marker_of_its_own_stops_collection_naming_the_folder(tmp_path: Path) -> None:
    done = collect(planted_tree(tmp_path, {**MARKED, **UNMARKED}))
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    refused = dict(
        line.strip().split(" is marked ", 1)
        for line in done.stderr.splitlines()
        if " is marked " in line
    )
    assert refused == {
        "tests/test_planted.py::test_decorated": (
            "slow: move it to tests/slow/test_planted.py and drop the marker"
        ),
        "tests/test_planted.py::test_param[2]": (
            "training: move it to tests/training/test_planted.py and drop the marker"
        ),
        "tests/cli/test_planted.py::test_module_marked": (
            "slow: move it to tests/cli/slow/test_planted.py and drop the marker"
        ),
        "tests/slow/test_planted.py::test_in_its_folder": (
            "slow: drop the marker; where it is gives its lane (slow)"
        ),
        "tests/browser/test_planted.py::test_elsewhere": (
            "training: drop the marker; where it is gives its lane (browser)"
        ),
    }, done.stderr


def test_folders_give_lanes_at_any_depth(tmp_path: Path) -> None:
    root = planted_tree(tmp_path, UNMARKED)
    fast = collect(root, "-m", "not (slow or training or postgres)")
    assert fast.returncode == 0, fast.stdout + fast.stderr
    assert [line for line in fast.stdout.splitlines() if "::" in line] == [
        "tests/test_plain.py::test_fast"
    ]
    # tinker_api is slow by the table; postgres by the fixture rule, on the PostgreSQL side only.
    lanes = collect(root, "-m", "slow or postgres")
    named = sorted(line for line in lanes.stdout.splitlines() if "::" in line)
    assert named == [
        "tests/cli/slow/test_plain.py::test_nested",
        "tests/tinker_api/test_plain.py::test_tinker_api",
        "tests/training/test_plain.py::test_trains[postgresql]",
    ], lanes.stdout + lanes.stderr
