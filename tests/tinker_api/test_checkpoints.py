"""Checkpoints through the API: a state saved and loaded with its optimizer trains on exactly as
if never interrupted, weights alone too; names, overwrite and missing paths as Tinker has them;
the RestClient's listing and deleting; the session as a run with its steps and checkpoints,
whose sampler checkpoint /v1 samples like any run's."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import tinker
from tinker import types

from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import KEY, WAIT_S
from tests.tinker_api.reference import ADAM, datums

pytestmark = pytest.mark.timeout(180)


def steps(training: tinker.TrainingClient, count: int) -> list[float]:
    data = datums("importance_sampling", 1)
    out = []
    for _ in range(count):
        future = training.forward_backward(data, "importance_sampling")
        training.optim_step(ADAM)
        out.append(future.result(WAIT_S).metrics["loss:sum"])
    return out


def test_state_with_optimizer_resumes_exactly(service: tinker.ServiceClient) -> None:
    straight = service.create_lora_training_client("tiny-random", rank=4, seed=21).result(WAIT_S)
    want = steps(straight, 4)

    first = service.create_lora_training_client("tiny-random", rank=4, seed=21).result(WAIT_S)
    assert steps(first, 2) == pytest.approx(want[:2], rel=1e-6)
    path = first.save_state("half").result(WAIT_S).path
    assert path == f"tinker://{first.model_id}/weights/half"

    resumed = service.create_training_client_from_state_with_optimizer(path).result(WAIT_S)
    assert resumed.get_info().lora_rank == 4
    assert steps(resumed, 2) == pytest.approx(want[2:], rel=1e-5)

    # Weights alone: the same start, a fresh optimizer (its first step differs from Adam's
    # third), so the second loss after it differs.
    fresh = service.create_training_client_from_state(path).result(WAIT_S)
    again = steps(fresh, 2)
    assert again[0] == pytest.approx(want[2], rel=1e-5)
    assert again[1] != pytest.approx(want[3], rel=1e-6)

    # The deprecated form loads into an existing client.
    with pytest.warns(FutureWarning):
        first.load_state_with_optimizer(path).result(WAIT_S)
    assert steps(first, 1) == pytest.approx(want[2:3], rel=1e-5)


def test_names_overwrite_and_missing_paths(service: tinker.ServiceClient) -> None:
    training = service.create_lora_training_client("tiny-random", rank=4, seed=2).result(WAIT_S)
    training.save_state("000005").result(WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match="named '000005' exists") as failed:
        training.save_state("000005").result(WAIT_S)
    assert failed.value.category == types.RequestErrorCategory.User
    assert training.save_state("000005", overwrite=True).result(WAIT_S).path.endswith("000005")
    with pytest.raises(tinker.RequestFailedError, match="not allowed"):
        training.save_state("../escape").result(WAIT_S)

    missing = f"tinker://{training.model_id}/weights/never-saved"
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint at") as failed:
        service.create_training_client_from_state(missing).result(WAIT_S)
    assert failed.value.category == types.RequestErrorCategory.User
    with pytest.raises(tinker.RequestFailedError, match="not a tinker:// path"):
        service.create_training_client_from_state("/etc/passwd").result(WAIT_S)
    # The session goes on after each refusal.
    assert steps(training, 1)


def test_the_session_is_a_run_with_steps_and_checkpoints(server: LiveServer) -> None:
    service = tinker.ServiceClient()
    training = service.create_lora_training_client("tiny-random", rank=4, seed=9).result(WAIT_S)
    sampler = training.save_weights_and_get_sampling_client().result(WAIT_S)
    sampler.sample(
        tinker.ModelInput.from_ints([5, 6, 7]), 2, tinker.SamplingParams(max_tokens=4, stop=[])
    ).result(WAIT_S)
    steps(training, 2)
    state = training.save_state("000002").result(WAIT_S).path
    weights = training.save_weights_for_sampler("000002").result(WAIT_S).path
    run_id = training.model_id.split(":")[0]

    listed = {r["run_id"]: r for r in server.api.get("/runs").json()}
    assert listed[run_id]["source"] == "tinker-api"
    assert listed[run_id]["status"] == "running"
    assert listed[run_id]["model_name"] == "tiny-random"
    sessions = server.api.get("/runs", params={"source": "tinker-api"}).json()
    assert run_id in {r["run_id"] for r in sessions} and {r["source"] for r in sessions} == {
        "tinker-api"
    }
    assert run_id not in {r["run_id"] for r in server.api.get("/runs?source=api").json()}
    history = server.api.get(f"/runs/{run_id}/history").json()["rows"]
    assert [row["step"] for row in history] == [1, 2]
    tokens = sum(d.model_input.length for d in datums("importance_sampling", 1))
    assert history[0]["train/tokens"] == tokens
    assert history[0]["sampler/tokens"] == 8  # two samples of four tokens, before step 1
    assert history[1]["sampler/tokens"] == 0
    assert history[1]["train/learning_rate"] == pytest.approx(ADAM.learning_rate)
    assert history[1]["train/grad_norm"] > 0 and "train/loss" in history[1]
    checkpoints = server.api.get(f"/runs/{run_id}/checkpoints").json()
    assert {(c["kind"], c["name"], c["step"]) for c in checkpoints} == {
        ("state", "000002", 2),
        ("sampler", "000002", 2),
    }

    rest = tinker.RestClient()
    run = rest.get_training_run(training.model_id).result(WAIT_S)
    assert run.base_model == "tiny-random" and run.lora_rank == 4
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == state
    assert run.last_sampler_checkpoint is not None
    listing = rest.list_checkpoints(training.model_id).result(WAIT_S).checkpoints
    assert {c.tinker_path for c in listing} == {state, weights}
    assert training.model_id in {
        r.training_run_id for r in rest.list_training_runs(limit=100).result(WAIT_S).training_runs
    }

    # /v1 samples the run's sampler checkpoint, as it does any run's.
    chat = server.api.post(
        "/v1/chat/completions",
        json={
            "model": f"{run_id}@step-2",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        },
        timeout=120,
    )
    assert chat.status_code == 200, chat.text
    # Test inference scores it on an environment (the session trained none of its own).
    assert server.api.post("/environments/arithmetic/select").status_code == 200
    tried = server.api.post(
        "/test/inference",
        json={"run_id": run_id, "checkpoint_step": 2, "num_items": 1, "max_tokens": 4},
        timeout=120,
    )
    assert tried.status_code == 200, tried.text
    assert tried.json()["model"] == "tiny-random" and tried.json()["adapter"].endswith("sampler")

    rest.delete_checkpoint_from_tinker_path(state).result(WAIT_S)
    remaining = server.api.get(f"/runs/{run_id}/checkpoints").json()
    assert [(c["kind"], c["name"]) for c in remaining] == [("sampler", "000002")]
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint at"):
        service.create_training_client_from_state(state).result(WAIT_S)

    service.close("success").result(WAIT_S)
    ended = server.api.get(f"/runs/{run_id}").json()
    assert ended["status"] == "succeeded"
    for verb in ("resume", "fork"):  # its training loop is its script's, not the server's
        refused = server.api.post(f"/runs/{run_id}/{verb}", json={})
        assert refused.status_code == 409 and "Tinker SDK session" in refused.json()["detail"]
    logs = server.api.get(f"/runs/{run_id}/logs", params={"tail": 50}).json()["lines"]
    assert any("step 2: loss" in line for line in logs)
    assert any("models freed" in line for line in logs) or _freed_soon(server, run_id)


def _freed_soon(server: LiveServer, run_id: str) -> bool:
    from tests.support.helpers import wait_for

    def freed() -> bool:
        lines = server.api.get(f"/runs/{run_id}/logs", params={"tail": 50}).json()["lines"]
        return any("models freed" in line for line in lines)

    return wait_for(freed, timeout=20)


def test_weights_info_and_capabilities(server: LiveServer, service: tinker.ServiceClient) -> None:
    training = service.create_lora_training_client("tiny-random", rank=2, seed=1).result(WAIT_S)
    path = training.save_state("w").result(WAIT_S).path
    info = tinker.RestClient().get_weights_info_by_tinker_path(path).result(WAIT_S)
    assert (info.base_model, info.lora_rank) == ("tiny-random", 2)
    answer = httpx.get(
        f"{server.url}/api/v1/get_server_capabilities", headers={"X-API-Key": KEY}
    ).json()
    (tiny,) = [m for m in answer["supported_models"] if m["model_name"] == "tiny-random"]
    assert tiny["max_context_length"] == 2048 and tiny["trainable"]
    assert Path(server.var_dir / "runs" / path.split("//")[1].split(":")[0]).is_dir()
