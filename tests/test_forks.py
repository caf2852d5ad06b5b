"""Forks: a run without a checkpoint cannot be forked (forks of real tiny-random runs:
tests/training/test_forks.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import finish_run, start_run
from tests.support.settings import make_settings


def test_a_run_without_a_checkpoint_cannot_be_forked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake runner records steps but never a checkpoint.
    monkeypatch.setenv("FAKE_RUNNER_STEP_S", "0.01")
    settings = make_settings(tmp_path, runner_module="tests.support.fake_runners.runner")
    with TestClient(create_app(settings)) as client:
        run_id = start_run(client, environment="arithmetic", total_steps=2)
        assert finish_run(client, run_id)["status"] == "succeeded"
        resp = client.post(f"/runs/{run_id}/fork", json={"total_steps": 4})
        assert resp.status_code == 409
        assert "no state checkpoint to fork from" in resp.json()["detail"]
        assert len(client.get("/runs").json()) == 1
    from tests.support.helpers import end_run_leftovers

    end_run_leftovers(tmp_path / "var")
    assert json.loads((tmp_path / "var" / "runs" / run_id / "config.json").read_text())
