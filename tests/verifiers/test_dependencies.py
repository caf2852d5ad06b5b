"""A verifiers environment's own dependencies (its pyproject.toml's): installed into the
verifiers interpreter when the server first lists the folder, or at `make install`, once; a
failure listed with uv's words, the environment refused until it is fixed. The interpreter
here is a throwaway one that sees .venv-verifiers' packages, so the shared one stays as its
lock made it; the dependency is a wheel written by the test, installed with no network."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.settings import PROJECT_ROOT
from server.app import create_app
from tests.support.settings import make_settings

COUNTS = '''import verifiers as vf
from datasets import Dataset
from rlcs_vowel_table import VOWELS


def load_environment(words: int = 2):
    """Count vowels, by a table from a package of its own."""
    rows = [{"question": f"Vowels in {w}?", "answer": str(sum(c in VOWELS for c in w))}
            for w in ["banana", "kiwi", "plum"][:words]]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[]))
'''


def write_wheel(folder: Path, name: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of `files`, as a build backend writes one (RECORD with hashes)."""
    dist = f"{name}-1.0.dist-info"
    files = {
        **files,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return wheel


def place(folder: Path, name: str, module: str, dependencies: list[str]) -> Path:
    """An environment folder whose pyproject.toml asks for `dependencies`."""
    where = folder / name.replace("-", "_")
    where.mkdir(parents=True)
    listed = ", ".join(f'"{d}"' for d in dependencies)
    (where / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1.0"\ndependencies = [{listed}]\n'
    )
    (where / f"{name.replace('-', '_')}.py").write_text(module)
    return where


@pytest.fixture
def interpreter(tmp_path: Path, verifiers_python: str) -> str:
    """A new interpreter that sees .venv-verifiers' packages (a .pth file) and installs into
    its own site-packages."""
    venv = tmp_path / "venv"
    subprocess.run([verifiers_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    theirs = subprocess.run(
        [verifiers_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = next((venv / "lib").glob("python3*/site-packages"))
    (ours / "verifiers_venv.pth").write_text(theirs + "\n")
    return str(venv / "bin" / "python")


@pytest.fixture
def envs(tmp_path: Path) -> Path:
    folder = tmp_path / "envs"
    folder.mkdir()
    return folder


@pytest.fixture
def client(
    tmp_path: Path, envs: Path, interpreter: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TestClient]:
    monkeypatch.setenv("UV_OFFLINE", "1")  # nothing here may come from the network
    settings = make_settings(
        tmp_path, env_dirs=[envs], verifiers_python=interpreter, inspect_timeout_s=30.0
    )
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def listed(client: TestClient, name: str) -> dict[str, Any]:
    found: dict[str, Any] = {e["name"]: e for e in client.get("/environments").json()}[name]
    return found


def settled(client: TestClient, name: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """The listing once its dependencies are no longer installing (the state is the event)."""
    deadline = time.monotonic() + timeout_s
    while (entry := listed(client, name))["dependencies"]["state"] == "installing":
        assert time.monotonic() < deadline, f"still installing after {timeout_s} s"
        time.sleep(0.2)
    return entry


def test_dependencies_are_installed_when_the_environment_is_placed(
    client: TestClient, envs: Path, tmp_path: Path, interpreter: str
) -> None:
    wheel = write_wheel(tmp_path, "rlcs_vowel_table", {"rlcs_vowel_table.py": 'VOWELS = "aeiou"\n'})
    assert "vowel-table" not in {e["name"] for e in client.get("/environments").json()}
    place(envs, "vowel-table", COUNTS, ["verifiers>=0.1.9", f"rlcs_vowel_table @ {wheel.as_uri()}"])
    first = listed(client, "vowel-table")
    assert first["dependencies"]["state"] in ("installing", "installed")
    # verifiers itself is the interpreter's: only what is the environment's own is installed.
    assert first["dependencies"]["requirements"] == [f"rlcs_vowel_table @ {wheel.as_uri()}"]
    entry = settled(client, "vowel-table")
    assert entry["dependencies"]["state"] == "installed", entry
    view = client.get("/environments/vowel-table/config")
    assert view.status_code == 200, view.text  # its inspector imported the new package
    assert view.json()["configurable_fields"]["words"] == 2
    imported = subprocess.run(
        [interpreter, "-c", "import rlcs_vowel_table; print(rlcs_vowel_table.VOWELS)"],
        capture_output=True,
        text=True,
    )
    assert imported.stdout.strip() == "aeiou", imported.stderr


def test_dependencies_that_do_not_install_are_listed_and_refuse_the_environment(
    client: TestClient, envs: Path
) -> None:
    place(envs, "missing-dep", COUNTS, ["rlcs-no-such-package==1.0"])
    place(envs, "bad-dep", COUNTS, ["verifiers>=0.1.9", "two words"])
    bad = listed(client, "bad-dep")  # not a requirement: refused before any installation
    assert bad["dependencies"]["state"] == "failed" and bad["importable"] is False
    assert "'two words' is not a requirement" in bad["error"]
    missing = settled(client, "missing-dep")
    assert missing["dependencies"]["state"] == "failed", missing
    assert missing["importable"] is False
    assert "rlcs-no-such-package" in missing["dependencies"]["error"]
    assert missing["error"].startswith("its dependencies did not install: uv pip install failed")
    for name, says in (("missing-dep", "rlcs-no-such-package"), ("bad-dep", "two words")):
        config = client.get(f"/environments/{name}/config")
        assert config.status_code == 409 and says in config.json()["detail"], config.text
        assert f"{envs / name.replace('-', '_')}/pyproject.toml" in config.json()["detail"]
        run = client.post("/runs", json={"environment": name})
        assert run.status_code == 409 and says in run.json()["detail"], run.text
    assert client.get("/runs").json() == []


def test_make_install_installs_every_environments_dependencies_once(
    tmp_path: Path, envs: Path, interpreter: str
) -> None:
    wheel = write_wheel(tmp_path, "rlcs_vowel_table", {"rlcs_vowel_table.py": 'VOWELS = "ae"\n'})
    place(envs, "vowel-table", COUNTS, [f"rlcs_vowel_table @ {wheel.as_uri()}"])
    env = {
        **os.environ,
        "UV_OFFLINE": "1",
        "RLCS_ENV_DIRS": f'["{envs}"]',
        "RLCS_VAR_DIR": str(tmp_path / "var"),
        "RLCS_VERIFIERS_PYTHON": interpreter,
    }
    argv = [sys.executable, "-m", "server.environments.verifiers.deps"]
    first = subprocess.run(argv, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert f"vowel-table: rlcs_vowel_table @ {wheel.as_uri()} installed now" in first.stdout
    # Done once: the second time finds its mark and asks uv nothing.
    again = subprocess.run(argv, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "installed before" in again.stdout
    settings = make_settings(tmp_path, env_dirs=[envs], verifiers_python=interpreter)
    with TestClient(create_app(settings)) as client:
        assert listed(client, "vowel-table")["dependencies"]["state"] == "installed"


def test_a_dependency_added_later_clears_the_import_error(
    client: TestClient, envs: Path, tmp_path: Path
) -> None:
    folder = place(envs, "vowel-table", COUNTS, ["verifiers>=0.1.9"])  # forgot its package
    refused = client.get("/environments/vowel-table/config")
    assert refused.status_code == 409 and "rlcs_vowel_table" in refused.json()["detail"]
    assert f"Add the package to the dependencies in {folder}/pyproject.toml" in refused.text
    assert listed(client, "vowel-table")["importable"] is False
    wheel = write_wheel(tmp_path, "rlcs_vowel_table", {"rlcs_vowel_table.py": 'VOWELS = "aeiou"\n'})
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(
            '"verifiers>=0.1.9"', f'"verifiers>=0.1.9", "rlcs_vowel_table @ {wheel.as_uri()}"'
        )
    )
    # The module is as it was: its ImportError is stale once the package it lacked is in.
    assert settled(client, "vowel-table")["dependencies"]["state"] == "installed"
    assert listed(client, "vowel-table")["importable"] is None  # not tried since
    view = client.get("/environments/vowel-table/config")
    assert view.status_code == 200, view.text
    assert listed(client, "vowel-table")["importable"] is True
