"""The real runner on the tinker backend: the unmodified SDK against the loopback stand-in.

Checks what the loop sends (loss inputs, their alignment and values, the order of calls),
not only that the run ends well.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from environments.repeat_word import WORDS
from runners.models.tiny import build_tiny_tokenizer
from server.app import create_app
from tests.hosted_tinker.conftest import TEST_KEY
from tests.support.helpers import finish_run, wait_for
from tests.support.settings import make_settings
from tests.support.standins.tinker_standin import TinkerStandin, token_logprob

TOKENIZER = build_tiny_tokenizer()


def word_sampler(prompt: list[int], index: int, params) -> list[int]:
    """Answers one of three words (seeded by the request), so rewards vary within a group."""
    word = random.Random(params.get("seed")).choice(WORDS[:3])
    return TOKENIZER.encode(word, add_special_tokens=False) + [TOKENIZER.eos_token_id]


@pytest.fixture
def standin_words():
    # tiny-random: a tokenizer the runner can build offline (the hosted models' need the hub).
    with TinkerStandin(
        expected_api_key=TEST_KEY, sample_fn=word_sampler, extra_models=("tiny-random",)
    ) as server:
        yield server


def test_runner_drives_tinker_with_the_right_data(tmp_path: Path, standin_words) -> None:
    prices = tmp_path / "tinker_prices.toml"  # hosted Tinker's prices, with a row for the model
    prices.write_text(
        'currency = "USD"\nas_of = "2026-10-07"\nsource = "a test"\n'
        '[models."tiny-random"]\nprefill = 1.0\nsample = 2.0\ntrain = 3.0\n'
    )
    settings = make_settings(
        tmp_path,
        tinker_api_key=TEST_KEY,
        tinker_base_url=standin_words.url,
        tinker_prices=prices,
        price_device_hour=100.0,  # our own devices' price: not what a hosted run pays
    )
    with TestClient(create_app(settings)) as client:
        assert client.get("/health").json()["backend"] == "tinker"
        body = {
            "environment": "repeat_word",
            "model_name": "tiny-random",
            "num_words": 3,
            "total_steps": 2,
            "group_size": 4,
            "batch_size": 3,
            "lora_rank": 16,
            "learning_rate": 1e-4,
            "loss_fn": "ppo",
            "loss_fn_config": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
            "max_token_length": 16,
            "save_every": 0,
            "steps_per_eval": 0,
            "use_wandb": False,
        }
        run_id = client.post("/runs", json=body).json()["run_id"]
        run = finish_run(client, run_id, 120)
        logs = "\n".join(client.get(f"/runs/{run_id}/logs", params={"tail": 100}).json()["lines"])
        assert run["status"] == "succeeded", logs
        assert run["weights_path"].startswith("tinker://")
        assert run["weights_path"].endswith("/sampler_weights/step-000002")
        assert TEST_KEY not in logs
        items = client.get(f"/runs/{run_id}/rollouts", params={"limit": 1000}).json()["items"]

    # What it cost: the tokens Tinker was sent and sampled, at hosted Tinker's prices.
    cost = run["cost"]
    trained = sum(
        len(d["model_input"]) for b in standin_words.bodies("forward_backward") for d in b["data"]
    )
    prefill = sum(
        len(c["tokens"]) for b in standin_words.bodies("asample") for c in b["prompt"]["chunks"]
    )
    sampled = sum(i["completion_tokens"] for i in items)
    assert (cost["tokens_prefill"], cost["tokens_sampled"], cost["tokens_trained"]) == (
        prefill,
        sampled,
        trained,
    )
    assert cost["device"] == "tinker" and cost["money_parts"]["device"] is None
    assert cost["money"] == pytest.approx((prefill + 2 * sampled + 3 * trained) / 1e6, abs=1e-6)
    assert "hosted Tinker's prices for tiny-random" in cost["basis"]

    created = standin_words.bodies("create_model")
    assert created[0]["base_model"] == "tiny-random"
    assert created[0]["lora_config"]["rank"] == 16

    calls = [
        c
        for c in standin_words.calls()
        if c
        in {
            "create_model",
            "forward_backward",
            "optim_step",
            "save_weights",
            "save_weights_for_sampler",
            "asample",
        }
    ]
    assert calls[0] == "create_model"
    # Each step: a sampler snapshot, samples, then forward_backward and optim_step in order.
    fb_at = [i for i, c in enumerate(calls) if c == "forward_backward"]
    assert len(fb_at) == 2
    for i in fb_at:
        assert calls[i + 1] == "optim_step"
        assert "asample" in calls[:i]
    assert calls[-2:] == ["save_weights", "save_weights_for_sampler"]

    adam = standin_words.bodies("optim_step")[0]["adam_params"]
    assert adam["learning_rate"] == pytest.approx(1e-4)
    for request in standin_words.bodies("forward_backward"):
        assert request["loss_fn"] == "ppo"
        assert request["loss_fn_config"] == {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
        assert request["data"], "groups with varying rewards must produce datums"
        for datum in request["data"]:
            tokens = datum["model_input"]
            inputs = datum["loss_fn_inputs"]
            assert set(inputs) == {"target_tokens", "logprobs", "advantages"}
            targets = inputs["target_tokens"]["values"]
            advantages = inputs["advantages"]["values"]
            logprobs = inputs["logprobs"]["values"]
            assert inputs["target_tokens"]["dtype"] == "int64"
            assert len(tokens) == len(targets) == len(advantages) == len(logprobs)
            assert targets[:-1] == tokens[1:]  # targets are the inputs shifted by one
            action = [i for i, a in enumerate(advantages) if a != 0.0]
            assert action and action == list(range(action[0], len(advantages)))
            assert len(set(advantages[action[0] :])) == 1
            # Prompt positions carry zeros; action positions the sampler's own logprobs.
            assert all(lp == 0.0 for lp in logprobs[: action[0]])
            assert logprobs[action[0] :] == pytest.approx(
                [token_logprob(t) for t in targets[action[0] :]]
            )


def test_a_stuck_tinker_call_fails_the_run_with_a_reason(tmp_path: Path, standin_words) -> None:
    """The SDK waits on a slow request indefinitely; every call the runner makes is bounded."""
    standin_words.endpoint_latency_s["asample"] = 6.0
    settings = make_settings(
        tmp_path,
        tinker_api_key=TEST_KEY,
        tinker_base_url=standin_words.url,
        backend_call_timeout_s=1.5,
    )
    with TestClient(create_app(settings)) as client:
        body = {
            "environment": "repeat_word",
            "model_name": "tiny-random",
            "total_steps": 1,
            "group_size": 2,
            "batch_size": 1,
            "max_token_length": 8,
            "save_every": 0,
            "steps_per_eval": 0,
            "use_wandb": False,
        }
        run_id = client.post("/runs", json=body).json()["run_id"]
        run = finish_run(client, run_id, 90)
    assert run["status"] == "failed", run
    assert "sample did not finish within 1.5 s" in run["error"]


def test_stop_right_after_a_periodic_save_ends_stopped(tmp_path: Path, standin_words) -> None:
    """The service refuses a second save_state of one name; the stop's checkpoint must not be
    a second save of the periodic one just made."""
    standin_words.endpoint_latency_s["asample"] = 0.3  # the next step is sampling when we stop
    settings = make_settings(tmp_path, tinker_api_key=TEST_KEY, tinker_base_url=standin_words.url)
    with TestClient(create_app(settings)) as client:
        body = {
            "environment": "repeat_word",
            "model_name": "tiny-random",
            "total_steps": 5,
            "group_size": 2,
            "batch_size": 1,
            "max_token_length": 8,
            "save_every": 1,
            "steps_per_eval": 0,
            "use_wandb": False,
        }
        run_id = client.post("/runs", json=body).json()["run_id"]
        # The first periodic checkpoint (its state, then its sampler weights) is asked for; the
        # runner then starts step 2.
        wait_for(
            lambda: any(
                b.get("path") == "step-000001"
                for b in standin_words.bodies("save_weights_for_sampler")
            ),
            120,
            every=0.05,
        )
        client.post(f"/runs/{run_id}/stop")
        run = finish_run(client, run_id, 120)
        logs = "\n".join(client.get(f"/runs/{run_id}/logs", params={"tail": 60}).json()["lines"])
        checkpoints = client.get(f"/runs/{run_id}/checkpoints").json()
    assert run["status"] == "stopped", logs
    assert "resumable" in run["details"]
    names = [b["path"] for b in standin_words.bodies("save_weights")]
    assert names[0] == "step-000001" and len(names) == len(set(names)), names  # none twice
    assert {c["step"] for c in checkpoints} == set(range(1, run["step"] + 1))
