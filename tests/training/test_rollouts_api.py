"""Real tiny-random runs recording their episodes: a step's average is its reward/mean, the
limits hold, a record that cannot be written stops saying so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import TINY_RUN, finish_run, start_run
from tests.support.settings import make_settings


def history_rewards(client: TestClient, run_id: str) -> dict[int, float]:
    rows = client.get(f"/runs/{run_id}/history", params={"keys": "reward/mean"}).json()["rows"]
    return {row["step"]: row["reward/mean"] for row in rows}


def all_items(client: TestClient, run_id: str, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        answer = client.get(
            f"/runs/{run_id}/rollouts", params={**params, "limit": 1000, "cursor": cursor}
        )
        assert answer.status_code == 200, answer.text
        page = answer.json()
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


def test_a_real_run_records_every_episode_and_a_step_averages_to_its_reward(
    tmp_path: Path,
) -> None:
    with TestClient(create_app(make_settings(tmp_path, stop_grace_s=30.0))) as client:
        run_id = start_run(
            client, environment="arithmetic", total_steps=2, steps_per_eval=0, **TINY_RUN
        )
        run = finish_run(client, run_id)
        assert run["status"] == "succeeded", run
        rewards = history_rewards(client, run_id)
        items = all_items(client, run_id)
        per_step = TINY_RUN["group_size"] * TINY_RUN["batch_size"]
        assert len(items) == 2 * per_step
        for step in (1, 2):
            mine = [i for i in items if i["step"] == step]
            assert len(mine) == per_step
            mean = sum(i["reward"] for i in mine) / len(mine)
            assert mean == pytest.approx(rewards[step], abs=1e-9)
            assert {i["group"] for i in mine} == {0, 1}
        item = items[0]
        assert item["kind"] == "episode" and item["prompt"] and item["completion_tokens"] > 0
        assert [s["role"] for s in item["segments"]] == ["env", "model"]
        assert item["finish_reason"] in {"stop", "length"} and item["logprob_mean"] < 0
        # An advantage on the episodes that were trained on, none on a dropped group's.
        assert all((i["advantage"] is None) != i["trained"] for i in items)
        steps = client.get(f"/runs/{run_id}/rollouts/steps").json()["steps"]
        assert [(s["step"], s["sampled"], s["kept"]) for s in steps] == [
            (1, per_step, per_step),
            (2, per_step, per_step),
        ]
        assert [s["reward_mean"] for s in steps] == pytest.approx([rewards[1], rewards[2]])
        metrics = client.get(f"/runs/{run_id}/history").json()["rows"]
        assert not any("rollouts/stopped" in row for row in metrics)

        # The export carries them on request, as the API's items.
        answer = client.post(f"/runs/{run_id}/export", json={"include_rollouts": True})
        assert answer.status_code == 200, answer.text
        exported = answer.json()
        assert "rollouts.jsonl" in exported["files"]
        lines = (Path(exported["path"]) / "rollouts.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == items
        assert not list(Path(exported["path"]).parent.glob(".rollouts-*"))  # no leftovers


def test_the_limits_hold_under_a_run_that_writes_more_than_its_cap(tmp_path: Path) -> None:
    cap_mb = 0.004
    with TestClient(create_app(make_settings(tmp_path, stop_grace_s=30.0))) as client:
        run_id = start_run(
            client,
            environment="arithmetic",
            total_steps=4,
            steps_per_eval=0,
            save_every=0,
            rollouts_per_step=3,
            rollouts_max_mb=cap_mb,
            **TINY_RUN,
        )
        run = finish_run(client, run_id)
        assert run["status"] == "succeeded", run
        record = client.get(f"/runs/{run_id}/rollouts/steps").json()
        rewards = history_rewards(client, run_id)
    per_step = TINY_RUN["group_size"] * TINY_RUN["batch_size"]
    steps = record["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["sampled"] == per_step and s["recorded"] == 3 for s in steps)
    # Each step's rewards still cover every episode it had, kept or not.
    assert [s["reward_mean"] for s in steps] == pytest.approx([rewards[k] for k in (1, 2, 3, 4)])
    assert record["size_bytes"] <= cap_mb * 1e6
    assert steps[-1]["kept"] == 3 and steps[-1]["note"] is None  # the newest is whole
    thinned = [s for s in steps if s["kept"] < s["recorded"]]
    assert thinned and all("rollouts_max_mb" in s["note"] for s in thinned)
    assert [s["step"] for s in thinned] == [
        s["step"] for s in steps[: len(thinned)]
    ]  # oldest first


def test_a_record_that_cannot_be_written_stops_saying_so_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    with TestClient(create_app(make_settings(tmp_path, stop_grace_s=30.0))) as client:
        # What a full disk does to the record's inserts, made real by the database itself.
        with client.app.state.services.engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TRIGGER disk_full BEFORE INSERT ON rollout "
                "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
            )
        run_id = start_run(
            client, environment="arithmetic", total_steps=2, steps_per_eval=0, **TINY_RUN
        )
        run = finish_run(client, run_id)
        logs = client.get(f"/runs/{run_id}/logs", params={"tail": 200}).json()["lines"]
        assert run["status"] == "succeeded", logs
        assert run["step"] == 2 and run["metrics"]["reward_mean"] is not None
        said = [line for line in logs if "rollouts are not recorded from step 1" in line]
        assert said and "database or disk is full" in said[0] and "the run goes on" in said[0]
        record = client.get(f"/runs/{run_id}/rollouts/steps").json()
        assert [(s["step"], s["kept"]) for s in record["steps"]] == [(1, 0)]
        assert "not recorded from step 1" in record["steps"][0]["note"]
        assert client.get(f"/runs/{run_id}/rollouts").json()["items"] == []
