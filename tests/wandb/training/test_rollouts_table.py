"""A run with W&B on logs each step's kept rollouts as a W&B table (the real client, online,
against the stand-in): one table per step in the step's own history row, with the episodes
the database holds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import finish_run
from tests.support.settings import make_settings
from tests.support.standins.wandb_standin import WandbStandin
from tests.wandb.conftest import KEY

BODY = {
    "environment": "arithmetic",
    "model_name": "tiny-random",
    "total_steps": 2,
    "save_every": 0,
    "group_size": 2,
    "batch_size": 2,
    "max_token_length": 8,
    "steps_per_eval": 0,
    "use_wandb": True,
    "wandb_project": "rl-rollouts",
    "rollouts_per_step": 3,
}


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> Iterator[WandbStandin]:
    monkeypatch.delenv("WANDB_MODE", raising=False)  # tests/conftest.py sets offline
    with WandbStandin(expected_api_key=KEY) as server:
        yield server


def test_each_step_logs_its_rollouts_as_a_table(tmp_path: Path, online: WandbStandin) -> None:
    settings = make_settings(tmp_path, wandb_api_key=KEY, wandb_base_url=online.url)
    with TestClient(create_app(settings)) as client:
        run_id = client.post("/runs", json=BODY).json()["run_id"]
        run = finish_run(client, run_id, timeout=180)
        assert run["status"] == "succeeded", run
        kept = client.get(f"/runs/{run_id}/rollouts").json()["items"]
    entity, project, wandb_id = run["wandb_path"].split("/")
    logged = online.run(entity, project, wandb_id)
    assert [row["_step"] for row in logged.history] == [1, 2]  # the table shares its step's row
    for row in logged.history:
        table = row["rollouts"]
        assert table["_type"] == "table-file" and table["nrows"] == 3
        assert "reward/mean" in row
    tables = {
        name: json.loads(data)
        for name, data in logged.files.items()
        if name.endswith(".table.json")
    }
    assert len(tables) == 2
    for data in tables.values():
        assert data["columns"][:4] == ["group", "index", "reward", "advantage"]
        assert len(data["data"]) == 3
    completions = sorted(r[7] for t in tables.values() for r in t["data"])
    assert completions == sorted(i["completion"] for i in kept)
