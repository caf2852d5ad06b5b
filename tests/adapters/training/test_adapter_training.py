"""One short real training run per adapter through the API (tiny-random model, real runner)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import wait_for
from tests.support.settings import make_settings

# Each run starts a runner process that imports torch.

FINAL = {"succeeded", "failed", "stopped"}
TINY = {
    "model_name": "tiny-random",
    "total_steps": 1,
    "group_size": 2,
    "batch_size": 1,
    "max_token_length": 8,
    "use_wandb": False,
    "save_every": 0,
    "steps_per_eval": 0,
    "lora_rank": 4,
}


@pytest.fixture
def tclient(tmp_path: Path):
    with TestClient(create_app(make_settings(tmp_path))) as client:
        yield client


def run_to_end(client: TestClient, body: dict) -> tuple[dict, str]:
    resp = client.post("/runs", json={**TINY, **body})
    assert resp.status_code == 200, resp.text
    run_id = resp.json()["run_id"]
    run = wait_for(
        lambda: (r := client.get(f"/runs/{run_id}").json())["status"] in FINAL and r,
        180,
        every=0.25,
    )
    lines = client.get(f"/runs/{run_id}/logs", params={"tail": 200}).json()["lines"]
    return run, "\n".join(lines)


def test_gem_run_succeeds(tclient: TestClient) -> None:
    run, logs = run_to_end(tclient, {"environment": "gem"})
    assert run["status"] == "succeeded", logs
    assert run["step"] == 1
    assert "episode failed" not in logs and "best episode" in logs


def test_reasoning_gym_run_succeeds(tclient: TestClient) -> None:
    run, logs = run_to_end(tclient, {"environment": "reasoning_gym", "dataset": "basic_arithmetic"})
    assert run["status"] == "succeeded", logs
    assert "episode failed" not in logs and "best episode" in logs


def test_openreward_run_on_loopback_succeeds(tclient: TestClient, openreward_url: str) -> None:
    body = {"environment": "openreward", "env_name": "guessenv", "base_url": openreward_url}
    run, logs = run_to_end(tclient, {**body, "max_turns": 2})
    assert run["status"] == "succeeded", logs
    assert "2 turns" in logs  # the tiny model never calls the tool: the turn limit ends it
    assert "episode failed" not in logs and "best episode" in logs
