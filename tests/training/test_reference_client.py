"""The reference client (tests/support/reference_client/rl_training_tool.py), its code
unchanged, drives a live server end to end on the local default model (SmolLM2), within its
own 30 s timeouts: a fresh server (nothing loaded yet; SmolLM2 converted, as the set-up leaves
it), inference with its default max_tokens=256, a run with its default body, status, results
and stop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.model_names import LOCAL_DEFAULT_MODEL
from tests.support.live_server import LiveServer
from tests.support.reference_client.load import CLIENT_TIMEOUT_S, call, load_client
from tests.support.reference_client.steps import edit_config, finished_run, start_training

# Three prompts, two of which ask for long answers (the case that used to time out).
PROMPTS = [
    "What is 7 + 5? Put the final answer in \\boxed{}.",
    "Explain step by step how to compute 37 * 24, then give the result in \\boxed{}.",
    "Write a short story about a robot who learns arithmetic. End it with the value of "
    "12 - 5 in \\boxed{}.",
]


@pytest.fixture
def server(tmp_path: Path, prepared_models_dir: Path) -> Iterator[LiveServer]:
    # A fresh var folder and the models folder the set-up prepared: SmolLM2 is loaded after
    # start-up, by the warm-up, as on a new machine after `make install`.
    with LiveServer(
        tmp_path / "var", RLCS_INFERENCE_WARMUP="1", RLCS_MODELS_DIR=str(prepared_models_dir)
    ) as live:
        yield live


def test_reference_client_unchanged_drives_a_run_on_the_local_default(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    rl = load_client(monkeypatch, server.url)

    health, _ = call(rl.rl_health_check)
    assert health["status"] == "ok" and health["backend"] == "local", health

    listed, _ = call(rl.rl_list_environments)
    assert "arithmetic" in {e["name"] for e in listed["environments"]}, listed

    selected, _ = call(rl.rl_select_environment, "arithmetic")
    assert selected["selected"] == "arithmetic", selected

    config, _ = call(rl.rl_get_current_config)
    assert config["configurable_fields"]["model_name"] == LOCAL_DEFAULT_MODEL, config
    edit_config(
        rl,
        [
            ("total_steps", 2),
            ("group_size", 2),
            ("batch_size", 2),
            ("max_token_length", 16),
            ("steps_per_eval", 2),
            ("eval_num_tasks", 2),
            ("save_every", 1),
        ],
    )

    # The first inference after start-up, then a warm one: each answers within the client's
    # own timeout, and a response the budget cut short says so.
    for attempt in ("first", "warm"):
        answer, took = call(rl.rl_test_inference, PROMPTS)
        assert "error" not in answer, f"{attempt} call: {answer}"
        assert took < CLIENT_TIMEOUT_S
        results = answer["results"]
        assert [r["prompt"] for r in results] == PROMPTS
        for result in results:
            assert result["tokens"] <= 256
            if result["truncated"]:
                assert "time budget" in result["reason"], result
            else:
                assert result["response"], result
        assert answer["summary"]["truncated"] == sum(r["truncated"] for r in results)
        assert answer["model"] == LOCAL_DEFAULT_MODEL
        print(f"{attempt} inference: {took:.1f} s, {answer['summary']}")

    run_id = start_training(rl)
    summary = finished_run(rl, run_id, 600, every=2.0)
    assert summary["status"] == "succeeded", summary

    status, _ = call(rl.rl_check_status, run_id)
    assert status["status"] == "succeeded" and status["step"] == 2, status
    assert set(status["metrics"]) >= {"reward_mean", "loss", "percent_correct"}
    again, _ = call(rl.rl_check_status, run_id)
    assert again["rate_limited"] is True  # the client's own 30-minute rule, unchanged

    results, _ = call(rl.rl_get_results, run_id)
    assert results["weights_path"] and results["history"], results
    assert results["metrics"]["eval_percent_correct"] is not None

    stopped, _ = call(rl.rl_stop_training, run_id)
    assert stopped == {"run_id": run_id, "status": "succeeded"}
