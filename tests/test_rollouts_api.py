"""GET /runs/{id}/rollouts and /rollouts/steps: pages of a run's recorded episodes, filtered and
typed, each step's record, bad queries answered 4xx naming the field, read tokens reading them;
and real tiny-random runs recording their episodes (a step's average is its reward/mean; the
per-step and size limits hold under a run that writes more than its cap; export adds them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import TINY_RUN, finish_run, start_run
from tests.support.rollouts import RUN, seed_run, two_steps
from tests.support.settings import make_settings


@pytest.fixture
def seeded(tmp_path: Path) -> Any:
    with TestClient(create_app(make_settings(tmp_path))) as client:
        seed_run(client.app.state.services.engine, RUN, two_steps())
        yield client


def test_a_page_holds_typed_episodes_in_step_order_with_a_cursor(seeded: TestClient) -> None:
    first = seeded.get(f"/runs/{RUN}/rollouts", params={"limit": 5})
    assert first.status_code == 200, first.text
    page = first.json()
    assert page["run_id"] == RUN and len(page["items"]) == 5 and page["next_cursor"]
    item = page["items"][0]
    assert {k: item[k] for k in ("step", "group", "index", "reward", "advantage")} == {
        "step": 1,
        "group": 0,
        "index": 0,
        "reward": 0.0,
        "advantage": -0.5,
    }
    assert item["prompt"] == "What is 0 + 0?" and item["completion"] == "answer 0"
    assert item["finish_reason"] == "stop" and item["picked"] == "all"
    assert item["metrics"] == {"correct": 0.0} and item["logprob_mean"] == -1.5
    assert [s["role"] for s in item["segments"]] == ["env", "model"]
    rest = seeded.get(
        f"/runs/{RUN}/rollouts", params={"limit": 100, "cursor": page["next_cursor"]}
    ).json()
    assert rest["next_cursor"] is None
    seen = [(i["step"], i["index"]) for i in page["items"] + rest["items"]]
    assert seen == [(1, i) for i in range(8)] + [(2, i) for i in range(8)]


def test_filters_by_step_group_reward_and_prompt(seeded: TestClient) -> None:
    def items(**params: Any) -> list[dict[str, Any]]:
        answer = seeded.get(f"/runs/{RUN}/rollouts", params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()["items"]

    assert {i["step"] for i in items(step=2)} == {2}
    assert [i["index"] for i in items(step=1, group=1)] == [4, 5, 6, 7]
    assert {i["reward"] for i in items(step=1, min_reward=0.5)} == {1.0}
    assert {i["reward"] for i in items(step=1, max_reward=0.5)} == {0.0}
    key = items(step=1, group=1)[0]["prompt_key"]
    across = items(prompt_key=key)  # one prompt's completions across steps
    assert {(i["step"], i["group"]) for i in across} == {(1, 1), (2, 1)}
    assert items(step=3) == []


def test_each_steps_record_says_what_it_had_and_kept(seeded: TestClient) -> None:
    answer = seeded.get(f"/runs/{RUN}/rollouts/steps")
    assert answer.status_code == 200, answer.text
    record = answer.json()
    assert record["rollouts_per_step"] == 256 and record["rollouts_max_mb"] == 64
    first, second = record["steps"]
    assert (first["step"], first["sampled"], first["recorded"], first["kept"]) == (1, 8, 8, 8)
    assert (first["reward_mean"], first["reward_min"], first["reward_max"]) == (0.5, 0.0, 1.0)
    assert second["reward_mean"] == 1.0 and record["size_bytes"] > 0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"step": "-1"}, "step"),
        ({"step": "three"}, "step"),
        ({"group": "-2"}, "group"),
        ({"min_reward": "high"}, "min_reward"),
        ({"min_reward": "2", "max_reward": "1"}, "min_reward"),
        ({"limit": "0"}, "limit"),
        ({"limit": "100000"}, "limit"),
        ({"cursor": "next-please"}, "cursor"),
        ({"prompt_key": "<script>"}, "prompt_key"),
    ],
)
def test_a_bad_query_is_a_422_naming_the_field(
    seeded: TestClient, params: dict[str, str], field: str
) -> None:
    answer = seeded.get(f"/runs/{RUN}/rollouts", params=params)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith(f"{field}:"), answer.text


def test_an_unknown_or_malformed_run_is_refused(seeded: TestClient) -> None:
    for path in ("/runs/r-12345678/rollouts", "/runs/r-12345678/rollouts/steps"):
        answer = seeded.get(path)
        assert answer.status_code == 404 and "r-12345678" in answer.json()["detail"]
    answer = seeded.get("/runs/nope/rollouts")
    assert answer.status_code == 422 and answer.json()["detail"].startswith("run_id:")


def test_read_tokens_read_rollouts_as_they_read_metrics(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, api_token="admin-token", read_tokens="reader-token")
    with TestClient(create_app(settings)) as client:
        seed_run(client.app.state.services.engine, RUN, two_steps())
        assert client.get(f"/runs/{RUN}/rollouts").status_code == 401
        reader = {"Authorization": "Bearer reader-token"}
        for path in (
            f"/runs/{RUN}/metrics",
            f"/runs/{RUN}/rollouts",
            f"/runs/{RUN}/rollouts/steps",
        ):
            assert client.get(path, headers=reader).status_code == 200, path


# Real runs ------------------------------------------------------------------------------


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


@pytest.mark.training
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


@pytest.mark.training
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


@pytest.mark.training
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
