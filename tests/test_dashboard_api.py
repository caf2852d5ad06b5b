"""What the dashboard reads: run summaries with model, latest reward, ETA and stall flag; a
run's frozen config; history thinned per metric (`max_points`); its assets served without a
token (they hold no data) while the API still asks for one."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from core import lifecycle
from core.db import write_session
from core.models import Run, RunStatus, utcnow
from core.procs import process_start_time
from core.settings import Settings
from server.app import create_app
from server.runs.metrics import thin
from tests.support.settings import make_settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Stalled after 2x the usual step time, from the first second.
    return make_settings(tmp_path, stall_min_s=0.0, stall_factor=2.0)


def add_run(client: TestClient, run_id: str, status: RunStatus, step: int, total: int) -> None:
    engine = client.app.state.services.engine  # type: ignore[attr-defined]
    started = utcnow() - timedelta(seconds=100)
    with write_session(engine) as session:
        session.add(
            Run(
                id=run_id,
                environment="arithmetic",
                status=status,
                config_json=json.dumps({"model_name": "tiny-random", "learning_rate": 0.1}),
                config_hash="h",
                step=0,
                total_steps=total,
                run_dir=f"/nowhere/{run_id}",
                started_at=started,
                # A live process (this one), so the supervisor adopts the run, not settles it.
                pid=os.getpid(),
                process_start=process_start_time(os.getpid()),
            )
        )
    for s in range(1, step + 1):
        at = started + timedelta(seconds=10 * s)
        values = {"reward/mean": s / 10, "time/step_s": 10.0}
        lifecycle.record_step(engine, run_id, s, values, at=at)
        lifecycle.record_metrics(engine, run_id, s, {"eval/percent_correct": 0.5})


def test_summaries_carry_model_reward_eta_and_stall(client: TestClient) -> None:
    add_run(client, "r-00000001", RunStatus.running, step=4, total=10)
    add_run(client, "r-00000002", RunStatus.queued, step=0, total=10)
    rows = {r["run_id"]: r for r in client.get("/runs").json()}
    running, queued = rows["r-00000001"], rows["r-00000002"]
    assert running["model_name"] == "tiny-random"
    assert running["reward_mean"] == 0.4  # the newest step's, not an evaluation row's
    assert running["eta_s"] == 60.0  # 10 s per step, 6 steps to go
    assert running["stalled"] is True  # no step for 60 s, 6x its usual step time
    assert queued["reward_mean"] is None and queued["eta_s"] is None
    assert queued["stalled"] is False
    detail = client.get("/runs/r-00000001").json()
    assert detail["config"] == {"model_name": "tiny-random", "learning_rate": 0.1}
    assert detail["reward_mean"] == detail["metrics"]["reward_mean"] == 0.4


def test_history_is_thinned_per_metric(client: TestClient) -> None:
    add_run(client, "r-00000003", RunStatus.running, step=50, total=100)
    rows = client.get("/runs/r-00000003/history", params={"max_points": 10}).json()["rows"]
    rewards = [r["step"] for r in rows if "reward/mean" in r]
    assert len(rewards) == 10 and rewards[0] == 1 and rewards[-1] == 50
    full = client.get("/runs/r-00000003/history").json()["rows"]
    assert len([r for r in full if "reward/mean" in r]) == 50
    bad = client.get("/runs/r-00000003/history", params={"max_points": 1})
    assert bad.status_code == 422 and "max_points" in bad.text


def test_thin_keeps_a_sparse_series_whole() -> None:
    rows = [{"step": s, "loss": float(s)} for s in range(1, 101)]
    rows += [{"step": s, "eval": 1.0} for s in (25, 50, 75, 100)]
    rows.sort(key=lambda r: r["step"])
    out = thin(rows, 5)
    assert [r["step"] for r in out if "eval" in r] == [25, 50, 75, 100]
    assert [r["step"] for r in out if "loss" in r] == [1, 26, 51, 75, 100]
    assert thin(rows, 1000) == rows


def test_assets_need_no_token_and_the_api_still_does(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, api_token="s3cret")
    with TestClient(create_app(settings)) as client:
        page = client.get("/")
        assert page.status_code == 200 and "/static/js/app.js" in page.text
        for asset in ("js/app.js", "js/pages/run.js", "css/dashboard.css", "vendor/uPlot.esm.js"):
            assert client.get(f"/static/{asset}").status_code == 200, asset
        assert "MIT" in client.get("/static/vendor/uPlot.LICENSE").text
        assert client.get("/static/../core/settings.py").status_code == 404
        assert client.get("/runs").status_code == 401
