"""GET /runs/{id} and /metrics answer from W&B when the run logs there, else from the database."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fastapi.testclient import TestClient

from core import lifecycle
from core.db import write_session
from core.models import Run, RunStatus
from server.app import create_app
from tests.support.helpers import wait_for
from tests.support.settings import make_settings
from tests.wandb.conftest import ENTITY, KEY, PATH, PROJECT, RUN_ID


def make_run(client: TestClient, wandb_path: str | None) -> str:
    """A running run as a runner would have left it: one local metrics row, a W&B path."""
    engine = client.app.state.services.engine
    run_id = "r-0000abcd"
    with write_session(engine) as session:
        session.add(
            Run(
                id=run_id,
                environment="arithmetic",
                status=RunStatus.running,
                config_json="{}",
                config_hash="h",
                total_steps=20,
                run_dir=str(Path(client.app.state.settings.runs_dir) / run_id),
                wandb_path=wandb_path,
                wandb_url=f"https://wandb.ai/{wandb_path}",
            )
        )
    lifecycle.record_step(engine, run_id, 3, {"reward/mean": 0.1, "train/loss": 2.0})
    return run_id


def settings_for(tmp_path: Path, standin, **extra):
    return make_settings(
        tmp_path,
        wandb_api_key=KEY,
        wandb_base_url=standin.url,
        wandb_cache_s=30.0,
        wandb_timeout_s=3.0,
        **extra,
    )


def test_status_maps_wandb_summary_and_caches(tmp_path: Path, standin) -> None:
    with TestClient(create_app(settings_for(tmp_path, standin))) as client:
        run_id = make_run(client, PATH)
        body = wait_for(
            lambda: (r := client.get(f"/runs/{run_id}").json())["metrics_source"] == "wandb" and r,
            20,
        )
        assert body["metrics"] == {
            "step": 9,
            "reward_mean": 0.625,
            "loss": 0.183,
            "percent_correct": 0.55,
            "eval_percent_correct": 0.5,
        }
        count = standin.request_count
        for _ in range(5):
            assert client.get(f"/runs/{run_id}").json()["metrics_source"] == "wandb"
        assert standin.request_count == count  # cached: W&B is not asked again
        results = client.get(f"/runs/{run_id}/metrics").json()
        assert results["metrics_source"] == "wandb" and results["metrics"]["step"] == 9


def test_slow_wandb_never_blocks_and_falls_back(tmp_path: Path, standin) -> None:
    with TestClient(create_app(settings_for(tmp_path, standin))) as client:
        run_id = make_run(client, PATH)
        standin.delay_s = 5.0
        started = time.monotonic()
        body = client.get(f"/runs/{run_id}").json()
        assert time.monotonic() - started < 4.5  # never the 5 s W&B takes
        assert body["metrics_source"] == "local" and body["metrics"]["reward_mean"] == 0.1
        assert "W&B" in body["metrics_note"] and KEY not in json.dumps(body)


def test_rate_limited_wandb_backs_off_to_local(tmp_path: Path, standin) -> None:
    with TestClient(create_app(settings_for(tmp_path, standin))) as client:
        run_id = make_run(client, PATH)
        standin.fail_next(10, 429)
        body = wait_for(
            lambda: (
                (r := client.get(f"/runs/{run_id}").json())["metrics_note"]
                and "429" in r["metrics_note"]
                and r
            ),
            20,
        )
        assert body["metrics_source"] == "local" and body["metrics"]["loss"] == 2.0
        count = standin.request_count
        client.get(f"/runs/{run_id}")
        assert standin.request_count == count  # backing off: no new request


def test_no_wandb_path_means_local(tmp_path: Path, standin) -> None:
    with TestClient(create_app(settings_for(tmp_path, standin))) as client:
        run_id = make_run(client, None)
        body = client.get(f"/runs/{run_id}").json()
        assert body["metrics_source"] == "local" and body["metrics_note"] is None
        assert "Run" not in standin.operations()  # at most the start-up log-in was sent


def test_no_key_means_local(tmp_path: Path, standin) -> None:
    with TestClient(create_app(make_settings(tmp_path))) as client:
        run_id = make_run(client, f"{ENTITY}/{PROJECT}/{RUN_ID}")
        body = client.get(f"/runs/{run_id}").json()
        assert body["metrics_source"] == "local" and "WANDB_API_KEY" in body["metrics_note"]
