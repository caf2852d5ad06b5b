"""The real tinker SDK 0.38 against the loopback stand-in, and our bounded wrapper around it.

Documents the SDK's wire behaviour we rely on: retries on 429/5xx, polling of futures, and the
endpoint create_training_client_from_state* uses (load_weights, a future, then get_info).
"""

from __future__ import annotations

import asyncio
import traceback

import numpy as np
import pytest
import tinker
from tinker import types

from runners.backends.tinker_backend import (
    TinkerCallError,
    TinkerUnavailable,
    create_tinker_service,
)
from tests.hosted_tinker.conftest import TEST_KEY
from tests.support.standins.tinker_standin import (
    TinkerStandin,
    default_sample_tokens,
    token_logprob,
)

BASE_MODEL = "Qwen/Qwen3-4B-Instruct-2507"
WAIT_S = 10.0
PPO_CONFIG = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}

# Two datums of different lengths; prompt positions carry advantage 0 and logprob 0.
DATUMS_SPEC = [
    {
        "tokens": [11, 12, 13, 14],
        "target_tokens": [12, 13, 14, 15],
        "logprobs": [0.0, 0.0, -1.25, -0.75],
        "advantages": [0.0, 0.0, 0.5, 0.5],
    },
    {
        "tokens": [21, 22, 23],
        "target_tokens": [22, 23, 24],
        "logprobs": [0.0, -0.875, -1.125],
        "advantages": [0.0, -1.0, -1.0],
    },
]


def make_datums() -> list[types.Datum]:
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(spec["tokens"]),
            loss_fn_inputs={
                "target_tokens": spec["target_tokens"],
                "logprobs": spec["logprobs"],
                "advantages": spec["advantages"],
            },
        )
        for spec in DATUMS_SPEC
    ]


def expected_ppo_loss() -> float:
    total = 0.0
    for spec in DATUMS_SPEC:
        lp = np.array([token_logprob(t) for t in spec["target_tokens"]])
        ratio = np.exp(lp - np.array(spec["logprobs"]))
        adv = np.array(spec["advantages"])
        total -= float(np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv).sum())
    return total


# ---- the real SDK against the stand-in -----------------------------------------------------


def test_create_lora_client_sends_base_model_and_rank(
    standin: TinkerStandin, sdk: tinker.ServiceClient
) -> None:
    training = sdk.create_lora_training_client(BASE_MODEL, rank=8, seed=3).result(WAIT_S)

    (create,) = standin.bodies("create_model")
    assert create["base_model"] == BASE_MODEL
    assert create["lora_config"]["rank"] == 8
    assert create["lora_config"]["seed"] == 3
    assert training.get_info().lora_rank == 8
    assert training.get_info().model_data.model_name == BASE_MODEL
    # Session setup, then the model; the key went out as X-API-Key on every request.
    assert standin.calls()[:3] == ["create_session", "create_model", "get_info"]
    assert {r.api_key for r in standin.requests()} == {TEST_KEY}
    sdk.close("success").result(WAIT_S)
    assert standin.calls()[-1] == "finish_session"


def test_ppo_forward_backward_pipelined_with_optim_step(
    standin: TinkerStandin, sdk: tinker.ServiceClient
) -> None:
    training = sdk.create_lora_training_client(BASE_MODEL, rank=16).result(WAIT_S)
    adam = types.AdamParams(learning_rate=2e-5, beta1=0.9, beta2=0.95, eps=1e-8)

    # Both submitted before either is awaited: one server clock cycle.
    fwd_bwd = training.forward_backward(make_datums(), "ppo", PPO_CONFIG)
    optim = training.optim_step(adam)
    output = fwd_bwd.result(WAIT_S)
    optim.result(WAIT_S)

    (sent,) = standin.bodies("forward_backward")
    assert sent["loss_fn"] == "ppo"
    assert sent["loss_fn_config"] == PPO_CONFIG
    assert sent["forward_only"] is False
    assert sent["model_id"] == training.model_id
    for datum, spec in zip(sent["data"], DATUMS_SPEC, strict=True):
        n = len(spec["tokens"])
        assert datum["model_input"] == spec["tokens"]
        inputs = datum["loss_fn_inputs"]
        assert set(inputs) == {"target_tokens", "logprobs", "advantages"}
        assert inputs["target_tokens"] == {
            "dtype": "int64",
            "shape": [n],
            "values": spec["target_tokens"],
        }
        for key in ("logprobs", "advantages"):
            assert inputs[key]["dtype"] == "float32"
            assert inputs[key]["shape"] == [n]
            assert inputs[key]["values"] == pytest.approx(spec[key])

    (step,) = standin.bodies("optim_step")
    assert step["adam_params"] == pytest.approx(
        {
            "learning_rate": 2e-5,
            "beta1": 0.9,
            "beta2": 0.95,
            "eps": 1e-8,
            "weight_decay": 0.0,
            "grad_clip_norm": 0.0,
        }
    )
    assert step["seq_id"] > sent["seq_id"]
    calls = standin.calls()
    assert calls.index("forward_backward") < calls.index("optim_step")

    # Logprobs come back per datum, as long as its input, from the stand-in's function.
    assert len(output.loss_fn_outputs) == 2
    for out, spec in zip(output.loss_fn_outputs, DATUMS_SPEC, strict=True):
        expected = [token_logprob(t) for t in spec["target_tokens"]]
        assert out["logprobs"].tolist() == pytest.approx(expected)
    assert output.metrics["loss:sum"] == pytest.approx(expected_ppo_loss(), rel=1e-5)


def test_await_style_importance_sampling_and_checkpoints(
    standin: TinkerStandin, sdk: tinker.ServiceClient
) -> None:

    async def run() -> tuple[types.ForwardBackwardOutput, str, str, tinker.TrainingClient]:
        training = await sdk.create_lora_training_client(BASE_MODEL, rank=4)
        fwd_bwd = training.forward_backward(make_datums(), "importance_sampling")
        optim = training.optim_step(types.AdamParams(learning_rate=1e-4))
        output = await fwd_bwd
        await optim
        state = await training.save_state("000002")
        sampler = await training.save_weights_for_sampler("000002")
        resumed = await sdk.create_training_client_from_state_with_optimizer(state.path)
        return output, state.path, sampler.path, resumed

    output, state_path, sampler_path, resumed = asyncio.run(run())
    model_id = standin.bodies("create_model")[0]["session_id"] + ":train:0"
    assert state_path == f"tinker://{model_id}/weights/000002"
    assert sampler_path == f"tinker://{model_id}/sampler_weights/000002"
    assert standin.bodies("forward_backward")[0]["loss_fn"] == "importance_sampling"
    assert standin.bodies("forward_backward")[0]["loss_fn_config"] == {}
    assert output.loss_fn_outputs[1]["logprobs"].tolist() == pytest.approx(
        [token_logprob(t) for t in DATUMS_SPEC[1]["target_tokens"]]
    )
    assert [b["path"] for b in standin.bodies("save_weights")] == ["000002"]
    assert [b.get("path") for b in standin.bodies("save_weights_for_sampler")] == ["000002"]

    # Resume is one load_weights request (a future, addressed by session and model_seq_id),
    # then get_info on the new model id; no create_model.
    (load,) = standin.bodies("load_weights")
    assert load["path"] == state_path
    assert load["optimizer"] is True
    assert "model_id" not in load and load["model_seq_id"] == 1
    assert standin.calls()[-2:] == ["load_weights", "get_info"]
    assert resumed.model_id == load["session_id"] + ":train:1"
    assert resumed.get_info().lora_rank == 4

    # Weights only (fresh optimizer): the same endpoint with optimizer false.
    sdk.create_training_client_from_state(state_path).result(WAIT_S)
    assert standin.bodies("load_weights")[-1]["optimizer"] is False


def test_sampling_with_stop_tokens_and_logprobs(
    standin: TinkerStandin, sdk: tinker.ServiceClient
) -> None:
    training = sdk.create_lora_training_client(BASE_MODEL, rank=8).result(WAIT_S)
    sampler = training.save_weights_and_get_sampling_client().result(WAIT_S)
    params = types.SamplingParams(max_tokens=5, temperature=0.7, stop=[13], seed=1)
    prompt = types.ModelInput.from_ints([1, 2, 3])

    response = sampler.sample(prompt, num_samples=3, sampling_params=params).result(WAIT_S)

    # The ephemeral snapshot is save_weights_for_sampler without a path.
    snapshot = standin.bodies("save_weights_for_sampler")[-1]
    assert "path" not in snapshot and "sampling_session_seq_id" in snapshot
    (sent,) = standin.bodies("asample")
    assert sent["num_samples"] == 3
    assert sent["prompt"]["chunks"][0]["tokens"] == [1, 2, 3]
    assert sent["sampling_params"]["max_tokens"] == 5
    assert sent["sampling_params"]["temperature"] == 0.7
    assert sent["sampling_params"]["stop"] == [13]

    assert len(response.sequences) == 3
    first, *rest = response.sequences
    assert first.tokens == [7, 10, 13] and first.stop_reason == "stop"  # stop token kept
    for index, seq in enumerate(rest, start=1):
        assert seq.tokens == default_sample_tokens([1, 2, 3], index, {"max_tokens": 5})
        assert seq.stop_reason == "length"
    for seq in response.sequences:
        assert seq.logprobs == pytest.approx([token_logprob(t) for t in seq.tokens])
        assert seq.sequence_id

    # A sampler from a saved path: create_sampling_session, then GET samplers/<id>.
    saved = training.save_weights_for_sampler("final").result(WAIT_S)
    by_path = sdk.create_sampling_client(model_path=saved.path).result(WAIT_S)
    assert by_path.get_base_model() == BASE_MODEL
    assert standin.calls()[-2:] == ["create_sampling_session", "get_sampler"]
    assert standin.bodies("create_sampling_session")[-1]["model_path"] == saved.path


def test_futures_are_polled_through_try_again(
    standin: TinkerStandin, sdk: tinker.ServiceClient
) -> None:
    standin.pending_polls = 2
    training = sdk.create_lora_training_client(BASE_MODEL, rank=8).result(WAIT_S)
    standin.clear()

    training.forward_backward(make_datums(), "ppo", PPO_CONFIG).result(WAIT_S)

    # Two try_again answers, then the protobuf result, all for one request id.
    polls = standin.bodies("retrieve_future")
    assert len(polls) == 3
    assert len({p["request_id"] for p in polls}) == 1


def test_unknown_loss_input_key_fails_the_future(
    standin: TinkerStandin, sdk: tinker.ServiceClient
) -> None:
    training = sdk.create_lora_training_client(BASE_MODEL, rank=8).result(WAIT_S)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={
            "target_tokens": [2, 3],
            "logprobs": [0.0, -1.0],
            "advantages": [0.0, 1.0],
            "mask": np.array([0.0, 1.0], dtype=np.float32),  # a plain list would raise KeyError
        },
    )
    with pytest.raises(tinker.RequestFailedError, match="unknown keys \\['mask'\\]"):
        training.forward_backward([datum], "ppo", PPO_CONFIG).result(WAIT_S)


def test_saving_a_name_twice_needs_overwrite(sdk: tinker.ServiceClient) -> None:
    training = sdk.create_lora_training_client(BASE_MODEL, rank=8).result(WAIT_S)
    first = training.save_state("final").result(WAIT_S).path
    with pytest.raises(tinker.RequestFailedError, match="exists"):
        training.save_state("final").result(WAIT_S)
    assert training.save_state("final", overwrite=True).result(WAIT_S).path == first


# ---- faults: what the SDK retries ----------------------------------------------------------


def test_bad_request_is_not_retried_and_does_not_poison(
    standin: TinkerStandin, sdk: tinker.ServiceClient
) -> None:
    training = sdk.create_lora_training_client(BASE_MODEL, rank=8).result(WAIT_S)
    standin.fail_next("forward_backward", count=1, status=400, detail="bad datum")

    with pytest.raises(tinker.BadRequestError, match="bad datum"):
        training.forward_backward(make_datums(), "ppo", PPO_CONFIG).result(WAIT_S)
    assert len(standin.requests("forward_backward")) == 1
    # In 0.38 only custom-loss failures poison a TrainingClient; later requests still run.
    training.optim_step(types.AdamParams(learning_rate=1e-4)).result(WAIT_S)


def test_injected_future_failure_raises_request_failed(
    standin: TinkerStandin, sdk: tinker.ServiceClient
) -> None:
    training = sdk.create_lora_training_client(BASE_MODEL, rank=8).result(WAIT_S)
    standin.fail_next_future("optim_step", "optimizer exploded", category="server")
    with pytest.raises(tinker.RequestFailedError, match="optimizer exploded"):
        training.optim_step(types.AdamParams(learning_rate=1e-4)).result(WAIT_S)


# ---- our wrapper ---------------------------------------------------------------------------


def error_text(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


def test_wrapper_refuses_a_missing_key_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The wrapper takes values from its caller, never from the environment.
    monkeypatch.setenv("TINKER_API_KEY", TEST_KEY)
    for missing in (None, "", "   "):
        with pytest.raises(TinkerUnavailable) as caught:
            create_tinker_service(missing, "http://127.0.0.1:9", timeout_s=2)
        assert "TINKER_API_KEY" in str(caught.value)
        assert '"local"' in str(caught.value)


def test_wrapper_refuses_a_malformed_key_without_echoing_it() -> None:
    secret = "sk-this-is-secret-and-wrong"
    with pytest.raises(TinkerUnavailable, match="tml-") as caught:
        create_tinker_service(secret, "http://127.0.0.1:9", timeout_s=2)
    assert secret not in error_text(caught.value)


def test_wrapper_reports_a_refused_key(standin: TinkerStandin) -> None:
    other_key = "tml-valid-looking-but-unknown"
    tinker_service = create_tinker_service(other_key, standin.url, timeout_s=5)
    with pytest.raises(TinkerUnavailable, match="refused the API key \\(HTTP 401\\)") as caught:
        tinker_service.create_lora_training_client(BASE_MODEL).result()
    assert other_key not in error_text(caught.value)


def test_wrapper_drives_the_sdk_end_to_end(standin: TinkerStandin) -> None:
    standin.fail_next("create_model", count=1, status=503, retry_after_s=0.05)
    with create_tinker_service(TEST_KEY, standin.url + "/", timeout_s=10) as tinker_service:
        assert tinker_service.base_url == standin.url
        training = tinker_service.create_lora_training_client(BASE_MODEL, rank=8, seed=1).result()
        assert isinstance(training, tinker.TrainingClient)
        fwd_bwd = training.forward_backward(make_datums(), "ppo", PPO_CONFIG)
        optim = training.optim_step(types.AdamParams(learning_rate=1e-4))
        fwd_bwd.result(WAIT_S)
        optim.result(WAIT_S)
        state = training.save_state("000001").result(WAIT_S)
        sampler_path = training.save_weights_for_sampler("000001").result(WAIT_S).path

        async def resume() -> tinker.TrainingClient:
            return await tinker_service.create_training_client_from_state_with_optimizer(state.path)

        resumed = asyncio.run(resume())
        assert resumed.get_info().lora_rank == 8
        sampler = tinker_service.create_sampling_client(model_path=sampler_path).result()
        response = sampler.sample(
            types.ModelInput.from_ints([4, 5]), 1, types.SamplingParams(max_tokens=4)
        ).result(WAIT_S)
        assert len(response.sequences[0].tokens) == 4
    assert standin.calls()[-1] == "finish_session"
    assert {r.api_key for r in standin.requests()} == {TEST_KEY}


def test_wrapper_reports_a_failed_call(standin: TinkerStandin) -> None:
    tinker_service = create_tinker_service(TEST_KEY, standin.url, timeout_s=10)
    missing = "tinker://nobody:train:0/weights/nothing"
    with pytest.raises(TinkerCallError, match="no training checkpoint") as caught:
        tinker_service.create_training_client_from_state_with_optimizer(missing).result()
    assert TEST_KEY not in error_text(caught.value)
    tinker_service.close()
