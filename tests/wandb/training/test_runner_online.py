"""The real runner logging to W&B online (the stand-in, through the real client), status read
back from W&B, and a resume from an older checkpoint rewinding the W&B run so its history
stays one row per step and status shows the live attempt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.db import read_session
from core.models import Metric
from server.app import create_app
from tests.support.helpers import wait_for
from tests.support.settings import make_settings
from tests.support.standins.wandb_standin import WandbStandin
from tests.wandb.conftest import KEY

PROJECT = "rl-online"
FINISHED = {"succeeded", "failed", "stopped"}
RUN_BODY = {
    "environment": "repeat_word",
    "model_name": "tiny-random",
    "total_steps": 4,
    "save_every": 2,
    "group_size": 2,
    "batch_size": 2,
    "max_token_length": 8,
    "steps_per_eval": 0,
    "use_wandb": True,
    "wandb_project": PROJECT,
    "learning_rate": 1e-3,
}


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> Iterator[WandbStandin]:
    # tests/conftest.py makes W&B offline for every other test; the runner inherits this.
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with WandbStandin(expected_api_key=KEY) as server:
        yield server


def finished(client: TestClient, run_id: str) -> dict[str, Any]:
    return wait_for(
        lambda: (r := client.get(f"/runs/{run_id}").json())["status"] in FINISHED and r,
        180,
        every=0.25,
    )


def database_rows(client: TestClient, run_id: str) -> dict[int, dict[str, Any]]:
    with read_session(client.app.state.services.engine) as session:
        rows = session.exec(Metric.__table__.select().where(Metric.run_id == run_id)).all()
    return {row.step: json.loads(row.values_json) for row in rows}


def test_online_run_reads_back_and_a_resume_rewinds_wandb(
    tmp_path: Path, online: WandbStandin
) -> None:
    settings = make_settings(
        tmp_path, wandb_api_key=KEY, wandb_base_url=online.url, wandb_cache_s=0.0
    )
    with TestClient(create_app(settings)) as client:
        run_id = client.post("/runs", json=RUN_BODY).json()["run_id"]
        run = finished(client, run_id)
        logs = client.get(f"/runs/{run_id}/logs", params={"tail": 80}).json()["lines"]
        assert run["status"] == "succeeded", "\n".join(logs)
        entity, project, wandb_id = run["wandb_path"].split("/")
        assert (entity, project) == (online.entity, PROJECT)
        assert run["wandb_url"].endswith(f"/{entity}/{project}/runs/{wandb_id}")

        # What the runner sent: the frozen config, one history row per step, a clean finish.
        first = online.run(entity, project, wandb_id)
        assert first.config["model_name"] == "tiny-random" and first.config["total_steps"] == 4
        assert [row["_step"] for row in first.history] == [1, 2, 3, 4]
        assert first.state == "finished" and first.exitcode == 0
        db = database_rows(client, run_id)
        assert first.summary["reward/mean"] == pytest.approx(db[4]["reward/mean"])

        # Status comes from W&B, and agrees with the database.
        status = wait_for(
            lambda: (r := client.get(f"/runs/{run_id}").json())["metrics_source"] == "wandb" and r,
            30,
        )
        assert status["metrics"]["step"] == 4
        assert status["metrics"]["reward_mean"] == pytest.approx(db[4]["reward/mean"])

        # A second attempt from the step-2 checkpoint redoes steps 3 and 4.
        resumed = client.post(f"/runs/{run_id}/resume", json={"checkpoint_step": 2})
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["resume_step"] == 2
        run = finished(client, run_id)
        assert run["status"] == "succeeded" and run["attempt"] == 2 and run["step"] == 4

        second = online.run(entity, project, wandb_id)
        assert second.rewinds == [2]
        steps = [row["_step"] for row in second.history]
        assert steps == [1, 2, 3, 4]  # monotonic, each step once: nothing dropped or doubled
        db = database_rows(client, run_id)
        for row in second.history:
            # Steps 3 and 4 hold the live attempt's values (the database replaced them too).
            assert row["reward/mean"] == pytest.approx(db[row["_step"]]["reward/mean"])
            assert row["time/step_s"] == pytest.approx(db[row["_step"]]["time/step_s"])
        assert second.history[2]["time/step_s"] != first.history[2]["time/step_s"]

        status = wait_for(
            lambda: (r := client.get(f"/runs/{run_id}").json())["metrics_source"] == "wandb" and r,
            30,
        )
        assert status["metrics"]["reward_mean"] == pytest.approx(db[4]["reward/mean"])
        assert status["metrics"]["step"] == 4
