"""Forks: a new run from a parent's checkpoint continues the parent's step count with the
parent's weights and optimizer state (it retraces the parent's own next steps), under a
changed config when asked; forks that cannot work are refused saying why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import TINY_RUN, finish_run, processes_with, start_run, wait_for
from tests.support.settings import make_settings


@pytest.fixture
def tclient(tmp_path: Path) -> Iterator[TestClient]:
    # float32 sampling: a rerun's sampler logprobs then agree to float32 noise. In bfloat16 (the
    # CPU's default) they agree to bf16 noise only, since a row's numbers depend on the batch
    # it shares (which requests join a step is timing), and the loss carries that into weights.
    settings = make_settings(tmp_path, stop_grace_s=30.0, sampling_dtype="float32")
    with TestClient(create_app(settings)) as c:
        yield c
    wait_for(lambda: not processes_with(tmp_path / "var" / "runs"), 30)


def steps(client: TestClient, run_id: str) -> dict[int, dict[str, float]]:
    """Each training step's reward and train/* metrics (the loss only where a step had
    non-zero advantages to train on)."""
    rows = client.get(f"/runs/{run_id}/history").json()["rows"]
    return {
        row["step"]: {k: v for k, v in row.items() if k == "reward/mean" or k.startswith("train/")}
        for row in rows
        if "reward/mean" in row
    }


def test_a_fork_retraces_its_parent_from_the_checkpoint_then_goes_its_own_way(
    tclient: TestClient,
) -> None:
    parent = start_run(
        tclient,
        environment="repeat_word",
        total_steps=4,
        save_every=2,
        steps_per_eval=0,
        seed=1,
        learning_rate=0.02,
        **{**TINY_RUN, "group_size": 8, "batch_size": 4},
    )
    assert finish_run(tclient, parent)["status"] == "succeeded"
    parent_steps = steps(tclient, parent)
    assert sorted(parent_steps) == [1, 2, 3, 4]
    assert any("train/loss" in parent_steps[s] for s in (3, 4))  # something was trained

    # From step 2 with the same config: the fork's steps 3 and 4 are the parent's steps 3 and
    # 4 (same weights, optimizer state and sampling seeds), so their rewards and losses agree.
    resp = tclient.post(f"/runs/{parent}/fork", json={"checkpoint_step": 2})
    assert resp.status_code == 200, resp.text
    forked = resp.json()
    assert forked["parent_run_id"] == parent and forked["parent_step"] == 2
    twin = forked["run_id"]
    queued = tclient.get(f"/runs/{twin}").json()
    assert queued["step"] == 2 and queued["parent_run_id"] == parent
    assert queued["parent_step"] == 2 and queued["total_steps"] == 4
    run = finish_run(tclient, twin)
    assert run["status"] == "succeeded", run["error"]
    twin_steps = steps(tclient, twin)
    assert sorted(twin_steps) == [3, 4]  # the count continues from the parent's step
    for step in (3, 4):
        assert twin_steps[step].keys() == parent_steps[step].keys()
        tokens = parent_steps[step].get("train/num_action_tokens", 0.0)
        for key, value in parent_steps[step].items():
            # Same samples: rewards and counts agree exactly. Loss and KL terms carry the float
            # noise of the sampler's and the trainer's logprobs (about 1e-3 per token), so a
            # sum over tokens agrees to that noise times the token count.
            tolerance = 1e-9
            if key.startswith(("train/loss", "train/kl")):
                tolerance = 1e-3 * (tokens if key.endswith("_sum") else 1.0)
            assert twin_steps[step][key] == pytest.approx(value, abs=tolerance), key

    # From the newest checkpoint (the parent's last step) under a changed config.
    resp = tclient.post(f"/runs/{parent}/fork", json={"learning_rate": 0.001, "total_steps": 6})
    assert resp.status_code == 200, resp.text
    child = resp.json()["run_id"]
    assert resp.json()["parent_step"] == 4
    run = finish_run(tclient, child)
    assert run["status"] == "succeeded", run["error"]
    assert run["config"]["learning_rate"] == 0.001 and run["step"] == 6
    assert sorted(steps(tclient, child)) == [5, 6]
    twin_log = "\n".join(tclient.get(f"/runs/{twin}/logs", params={"tail": 300}).json()["lines"])
    assert "resuming from" in twin_log and "step-000002" in twin_log
    logs = "\n".join(tclient.get(f"/runs/{child}/logs", params={"tail": 300}).json()["lines"])
    assert "resuming from" in logs and "step-000004" in logs
    # The parent is untouched.
    assert tclient.get(f"/runs/{parent}").json()["step"] == 4
    assert steps(tclient, parent) == parent_steps


def test_forks_that_cannot_work_are_refused(tclient: TestClient, tmp_path: Path) -> None:
    parent = start_run(
        tclient,
        environment="repeat_word",
        total_steps=2,
        save_every=0,
        steps_per_eval=0,
        **TINY_RUN,
    )
    assert finish_run(tclient, parent)["status"] == "succeeded"
    before = tclient.get("/runs").json()

    def refused(body: dict, status: int, *words: str) -> None:
        resp = tclient.post(f"/runs/{parent}/fork", json=body)
        assert resp.status_code == status, resp.text
        for word in words:
            assert word in resp.json()["detail"], resp.json()["detail"]

    refused({}, 422, "total_steps", "not past the checkpoint's step 2")  # nothing left to do
    refused({"total_steps": 4, "lora_rank": 16}, 422, "lora_rank", "POST /runs")
    refused({"total_steps": 4, "model_name": "gpt2"}, 422, "model_name")
    refused({"total_steps": 4, "checkpoint_step": 1}, 404, "has steps 2")
    refused({"total_steps": 4, "learning_rate": -1}, 422, "learning_rate")
    refused({"total_steps": 4, "resume_from": "/tmp/x"}, 422, "checkpoint_step")
    assert tclient.get("/runs").json() == before  # nothing was created

    missing = tclient.post("/runs/r-00000000/fork", json={"total_steps": 4})
    assert missing.status_code == 404
