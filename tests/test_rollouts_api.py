"""GET /runs/{id}/rollouts and /rollouts/steps: pages of a run's recorded episodes, filtered and
typed, each step's record, bad queries answered 4xx naming the field, read tokens reading them;
and real tiny-random runs recording their episodes (a step's average is its reward/mean; the
per-step and size limits hold under a run that writes more than its cap; export adds them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
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
