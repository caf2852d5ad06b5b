"""GET /runs/{id}/wait: answers as soon as the run reaches a step or finishes (within a
second of it), or at the timeout saying the condition did not hold; bad conditions get 422."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import end_run_leftovers, processes_with, wait_for
from tests.support.settings import make_settings

FAKE = "tests.support.fake_runners.runner"


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("FAKE_RUNNER_STEP_S", "0.1")
    monkeypatch.delenv("FAKE_RUNNER_MODE", raising=False)
    with TestClient(create_app(make_settings(tmp_path, runner_module=FAKE))) as c:
        yield c
    wait_for(lambda: not processes_with(tmp_path / "var" / "runs"), 20)
    end_run_leftovers(tmp_path / "var")  # the `sleep` each fake runner leaves on purpose


def start(client: TestClient, steps: int) -> str:
    resp = client.post("/runs", json={"environment": "arithmetic", "total_steps": steps})
    assert resp.status_code == 200, resp.text
    return resp.json()["run_id"]


def test_a_timeout_answers_with_the_state_as_it_is(client: TestClient) -> None:
    run_id = start(client, 200)
    began = time.monotonic()
    resp = client.get(f"/runs/{run_id}/wait", params={"until": "step:10000", "timeout": 0.5})
    assert resp.status_code == 200 and resp.json()["condition_met"] is False
    assert resp.json()["status"] in ("queued", "starting", "running")
    assert time.monotonic() - began < 5
    client.post(f"/runs/{run_id}/stop")


@pytest.mark.parametrize(
    ("params", "named"),
    [({"until": "step:x"}, "until"), ({"until": "done"}, "until"), ({"timeout": 601}, "timeout")],
)
def test_bad_conditions_are_refused(client: TestClient, params: dict, named: str) -> None:
    run_id = start(client, 1)
    resp = client.get(f"/runs/{run_id}/wait", params=params)
    assert resp.status_code == 422 and named in resp.json()["detail"], resp.text
    assert client.get("/runs/r-00000000/wait").status_code == 404
