"""Environment code in inspector subprocesses, the slow tests: hostile files, a hanging file,
an inspector stuck in an import."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from tests import test_env_isolation
from tests.support.helpers import pid_alive, wait_for
from tests.support.live_server import LiveServer
from tests.test_env_isolation import inspectors_of, refusal

# The fixtures these tests share with tests/test_env_isolation.py, bound here where pytest looks.
client = test_env_isolation.client
folder = test_env_isolation.folder


def test_hostile_files_get_a_4xx_that_says_what_happened(client: TestClient) -> None:
    assert "did not finish within 3 s" in refusal(client, "hangs")
    assert "boom at import" in refusal(client, "raises")
    assert "exit code 3" in refusal(client, "exits")
    assert "SystemExit: 2" in refusal(client, "sys_exits")
    # A flood of output is thrown away: the file itself is fine.
    assert client.post("/environments/floods/select").status_code == 200
    listed = {e["name"]: e for e in client.get("/environments").json()}
    for name in ("hangs", "raises", "exits", "sys_exits"):
        assert listed[name]["importable"] is False, listed[name]
    assert listed["floods"]["importable"] is True


def test_a_hanging_file_holds_up_nobody_else(client: TestClient) -> None:
    done = threading.Event()
    answers: dict[str, int] = {}

    def select_hanging() -> None:
        answers["hangs"] = client.post("/environments/hangs/select").status_code
        done.set()

    threading.Thread(target=select_hanging, daemon=True).start()
    # While that import hangs, another environment selects, edits and validates at once.
    assert client.post("/environments/fine/select").status_code == 200
    edit = client.post("/config", json={"field": "group_size", "value": 8})
    assert edit.status_code == 200
    bad = client.post("/config", json={"field": "group_size", "value": "8"})
    assert bad.status_code == 422 and "group_size" in bad.json()["detail"]
    assert not done.is_set()  # the other import is still hanging: nothing waited on it
    assert done.wait(10) and answers["hangs"] == 409
    assert client.get("/health").status_code == 200


def test_an_inspector_stuck_in_an_import_ends_with_its_server(tmp_path: Path, folder: Path) -> None:
    server = LiveServer(
        tmp_path / "live", RLCS_ENV_DIRS=json.dumps([str(folder)]), RLCS_INSPECT_TIMEOUT_S="120"
    ).start()

    def select_hanging() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server dies under it
            httpx.post(f"{server.url}/environments/hangs/select", timeout=60)

    try:
        threading.Thread(target=select_hanging, daemon=True).start()
        stuck = wait_for(lambda: inspectors_of(folder), 30)
    finally:
        server.kill(signal.SIGKILL)
    # Not the 120-s deadline: it saw us go. Its command line empties while it exits, before
    # it is a zombie, so wait on the processes themselves.
    wait_for(lambda: not any(pid_alive(pid) for pid in stuck), 5)
    assert not inspectors_of(folder)
