"""Environment code runs only in inspector subprocesses: a file that hangs, raises, exits or
floods its output at import gets a 4xx naming the file and what happened, and the server and
every other environment keep working."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import processes_with
from tests.support.settings import make_settings

CLASS = """
from environments.base import SingleTurnEnv, Task

class {cls}(SingleTurnEnv):
    '''{doc}'''
    name = "{name}"

    def get_task(self, seed, split="train"):
        return Task(prompt="say hi", answer="hi")

    def score(self, prompt, response, task=None):
        return float("hi" in response)
"""


def env_file(name: str, cls: str, at_import: str, doc: str = "An environment.") -> str:
    return CLASS.format(cls=cls, name=name, doc=doc) + "\n" + textwrap.dedent(at_import)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    envs = tmp_path / "envs"
    envs.mkdir()
    marker = tmp_path / "imported_by.txt"
    files = {
        "hangs.py": env_file("hangs", "Hangs", "import time\nwhile True:\n    time.sleep(1)\n"),
        "raises.py": env_file("raises", "Raises", "raise RuntimeError('boom at import')\n"),
        "exits.py": env_file("exits", "Exits", "import os\nos._exit(3)\n"),
        "sys_exits.py": env_file("sys_exits", "SysExits", "import sys\nsys.exit(2)\n"),
        "floods.py": env_file("floods", "Floods", "print('x' * 8_000_000)\n"),
        "fine.py": env_file(
            "fine", "Fine", f"import os\nopen({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        ),
    }
    for name, text in files.items():
        (envs / name).write_text(text)
    return envs


@pytest.fixture
def client(tmp_path: Path, folder: Path) -> Iterator[TestClient]:
    settings = make_settings(tmp_path, env_dirs=[folder], inspect_timeout_s=3.0)
    with TestClient(create_app(settings)) as c:
        yield c
    assert inspectors_of(folder) == []  # shutdown ended every inspector, hung ones included


def inspectors_of(folder: Path) -> list[int]:
    return processes_with("runners.inspector", folder)


def refusal(client: TestClient, name: str) -> str:
    resp = client.post(f"/environments/{name}/select")
    assert resp.status_code == 409, resp.text
    body = resp.json()
    assert body["importable"] is False and f"{name}.py" in body["detail"]
    return body["detail"]


def test_environment_code_never_runs_in_the_server(client: TestClient, tmp_path: Path) -> None:
    assert client.post("/environments/fine/select").status_code == 200
    assert client.get("/config").status_code == 200
    importers = {int(pid) for pid in (tmp_path / "imported_by.txt").read_text().split()}
    assert importers and os.getpid() not in importers
    assert refusal(client, "exits")  # and an exiting file did not take the server down
    assert client.get("/health").json()["status"] == "ok"


def test_an_edited_file_is_inspected_again(client: TestClient, folder: Path) -> None:
    assert "boom at import" in refusal(client, "raises")
    path = folder / "raises.py"
    path.write_text(env_file("raises", "Raises", "# fixed\n"))
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 5))
    assert client.post("/environments/raises/select").status_code == 200


def test_the_doors_inspectors_copy_of_the_protocol_agrees_with_ours() -> None:
    """runners/doors/envside/inspect_protocol.py cannot import core (the Atropos and verifiers
    inspectors load it by path, in interpreters with nothing of ours), so it spells the protocol
    itself: its answers must read as core.inspect_wire's, and its parent variable be ours."""
    from core.inspect_wire import ANSWER, Failed, plain_error
    from core.procs import PARENT_PID_VARIABLE
    from runners.doors.envside import inspect_protocol

    assert inspect_protocol.PARENT_PID_VARIABLE == PARENT_PID_VARIABLE
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        failed = ANSWER.validate_python(inspect_protocol.failed(exc))
    assert isinstance(failed, Failed) and failed.error.startswith("RuntimeError: boom (")
    error = {"loc": ("group_size",), "msg": "bad", "input": object(), "ctx": {"e": ValueError()}}
    assert inspect_protocol.plain_error(error) == plain_error(error)
