"""POST /runs/{id}/export of a run without a sampler checkpoint is refused, writing nothing (the
exports of real tiny-random runs: tests/training/test_export.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import end_run_leftovers, finish_run, processes_with, start_run, wait_for
from tests.support.settings import make_settings

FAKE = "tests.support.fake_runners.runner"


def test_a_run_without_a_sampler_checkpoint_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_RUNNER_STEP_S", "0.01")
    monkeypatch.delenv("FAKE_RUNNER_MODE", raising=False)
    with TestClient(create_app(make_settings(tmp_path, runner_module=FAKE))) as client:
        run_id = start_run(client, environment="arithmetic", total_steps=2)
        assert finish_run(client, run_id)["status"] == "succeeded"
        resp = client.post(f"/runs/{run_id}/export", json={})
        assert resp.status_code == 409
        assert "no sampler checkpoint" in resp.json()["detail"]
        assert not (tmp_path / "var" / "runs" / run_id / "export").exists()
    wait_for(lambda: not processes_with(tmp_path / "var" / "runs"), 20)
    end_run_leftovers(tmp_path / "var")
