"""What a real run spent (issue 36): its totals are what its steps sampled and trained, counted
again here from its recorded episodes; a resume continues them; the API shows them with money at
the prices set."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import TINY_RUN, finish_run, start_run
from tests.support.settings import make_settings

DEVICE_HOUR = 3.6  # per hour: a device second costs 0.001
PER_MTOK = 2.0


def episodes(client: TestClient, run_id: str) -> list[dict[str, Any]]:
    answer = client.get(f"/runs/{run_id}/rollouts", params={"limit": 1000})
    assert answer.status_code == 200, answer.text
    page = answer.json()
    assert page["next_cursor"] is None
    return list(page["items"])


def spent_by(items: list[dict[str, Any]]) -> dict[str, int]:
    """What these episodes cost in tokens, counted from their turns: each turn's prompt is
    prefilled and its action sampled; a turn trained on is one datum of its tokens but the
    last (the inputs of next-token targets)."""
    prefill = sampled = trained = 0
    for item in items:
        turns = item["segments"]
        for prompt, action in zip(turns[::2], turns[1::2], strict=True):
            prefill += prompt["tokens"]
            sampled += action["tokens"]
            if action["advantage"] is not None:
                trained += prompt["tokens"] + action["tokens"] - 1
    return {"tokens_prefill": prefill, "tokens_sampled": sampled, "tokens_trained": trained}


def wall_s(run: dict[str, Any]) -> float:
    started, finished = (
        datetime.fromisoformat(run[key].replace("Z", "+00:00"))
        for key in ("started_at", "finished_at")
    )
    return (finished - started).total_seconds()


def test_a_runs_cost_is_what_its_steps_sampled_and_trained_a_resume_adds_a_fork_starts_anew(
    tmp_path: Path,
) -> None:
    settings = make_settings(
        tmp_path,
        stop_grace_s=30.0,
        price_device_hour=DEVICE_HOUR,
        price_per_mtok_sampled=PER_MTOK,
        price_per_mtok_trained=PER_MTOK,
    )
    with TestClient(create_app(settings)) as client:
        run_id = start_run(
            client,
            environment="repeat_word",  # a dense reward: groups that teach something
            total_steps=2,
            save_every=1,
            steps_per_eval=0,
            **TINY_RUN,
        )
        run = finish_run(client, run_id)
        assert run["status"] == "succeeded", run
        first = run["cost"]
        items = episodes(client, run_id)
        assert {i["step"] for i in items} == {1, 2}
        assert {k: first[k] for k in ("tokens_prefill", "tokens_sampled", "tokens_trained")} == (
            spent_by(items)
        )
        assert first["tokens_trained"] > 0 and first["tokens_sampled"] > 0
        assert first["tokens"] == sum(spent_by(items).values())
        assert first["device"] == "cpu" and first["cpu_s"] > 0
        assert 0 < first["device_s"] <= wall_s(run)

        # Money at the prices set: device seconds and tokens sampled and trained; prefill has
        # no price here, so it is not in the money.
        parts = first["money_parts"]
        assert parts["prefill"] is None
        assert parts["device"] == pytest.approx(first["device_s"] * DEVICE_HOUR / 3600, abs=1e-5)
        assert parts["trained"] == pytest.approx(first["tokens_trained"] * PER_MTOK / 1e6)
        assert first["money"] == pytest.approx(
            parts["device"] + parts["sampled"] + parts["trained"], abs=1e-6
        )
        assert first["currency"] == "USD" and "RLCS_PRICE_DEVICE_HOUR 3.6 USD/h" in first["basis"]
        assert first["note"] is None

        # Each step's metrics carry the totals after it.
        rows = client.get(f"/runs/{run_id}/history", params={"keys": "cost/tokens_sampled"})
        sampled = [row["cost/tokens_sampled"] for row in rows.json()["rows"]]
        step1 = spent_by([i for i in items if i["step"] == 1])["tokens_sampled"]
        assert sampled == [step1, first["tokens_sampled"]]

        # The list shows the same, compactly.
        (listed,) = [r for r in client.get("/runs").json() if r["run_id"] == run_id]
        assert listed["cost"] == {
            "device_s": first["device_s"],
            "tokens": first["tokens"],
            "money": first["money"],
            "currency": "USD",
        }

        # A resume continues the totals: the new step's tokens are added to them.
        answer = client.post(f"/runs/{run_id}/resume", json={"total_steps": 3, "force": True})
        assert answer.status_code == 200, answer.text
        run = finish_run(client, run_id)
        assert run["status"] == "succeeded" and run["attempt"] == 2, run
        again = run["cost"]
        third = spent_by([i for i in episodes(client, run_id) if i["step"] == 3])
        for key, tokens in third.items():
            assert again[key] == first[key] + tokens
        assert first["device_s"] < again["device_s"] <= wall_s(run)
        assert again["money"] > first["money"]

        # A fork spends on its own account: its totals are its own step's, not its parent's.
        answer = client.post(f"/runs/{run_id}/fork", json={"checkpoint_step": 2})
        assert answer.status_code == 200, answer.text
        fork_id = answer.json()["run_id"]
        assert client.get(f"/runs/{fork_id}").json()["cost"]["note"].startswith("nothing spent")
        fork = finish_run(client, fork_id)
        assert fork["status"] == "succeeded" and fork["step"] == 3, fork
        own = spent_by(episodes(client, fork_id))
        assert {k: fork["cost"][k] for k in own} == own
        assert client.get(f"/runs/{run_id}").json()["cost"] == again
