"""An Atropos run's rollouts (a real run of the chat_dialogue test environment on tiny-random):
each scored sequence the trajectory API gave, its tokens split by the environment's mask into
the environment's text and the model's, its score and advantage, the chat it sent; a step's
sequences average to its reward/mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.atropos.conftest import atropos_server
from tests.support.helpers import finish_run, start_run

TINY = {"model_name": "tiny-random", "lora_rank": 8, "use_wandb": False, "groups_per_step": 2}


def test_an_atropos_run_records_its_scored_sequences(tmp_path: Path, atropos_python: str) -> None:
    with atropos_server(tmp_path / "var", RLCS_ATROPOS_START_TIMEOUT_S="90") as live:
        run_id = start_run(live.api, environment="chat_dialogue", total_steps=2, **TINY)
        run = finish_run(live.api, run_id, timeout=300)
        assert run["status"] == "succeeded", run
        rows = live.api.get(f"/runs/{run_id}/history", params={"keys": "reward/mean"}).json()
        rewards = {row["step"]: row["reward/mean"] for row in rows["rows"]}
        items = live.api.get(f"/runs/{run_id}/rollouts", params={"limit": 1000}).json()["items"]
        record = live.api.get(f"/runs/{run_id}/rollouts/steps").json()
    group_size = run["config"]["group_size"]
    assert [s["step"] for s in record["steps"]] == [1, 2]
    for step in (1, 2):
        mine = [i for i in items if i["step"] == step]
        assert len(mine) == 2 * group_size
        assert {i["group"] for i in mine} == {0, 1}
        assert sum(i["reward"] for i in mine) / len(mine) == pytest.approx(rewards[step])
    item = items[0]
    assert item["kind"] == "sequence"
    # The environment's chat (its first answer included: the environment trains on the last
    # turn only) and the model's trained tokens, told apart by the mask.
    assert [s["role"] for s in item["segments"]] == ["env", "model"]
    assert item["completion_tokens"] == sum(
        s["tokens"] for s in item["segments"] if s["role"] == "model"
    )
    assert [m["role"] for m in item["messages"]] == ["user", "assistant", "user", "assistant"]
    assert "Name a colour" in item["prompt"]
    assert all((i["advantage"] is None) != i["trained"] for i in items)
    trained = [i for i in items if i["trained"]]
    assert all(i["logprob_mean"] is not None and i["logprob_mean"] < 0 for i in trained)
