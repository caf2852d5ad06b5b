"""Done when: a tinker-atropos user drops their environment into a folder named in
RLCS_ENV_DIRS, and the reference client (tests/support/reference_client, unchanged) lists it,
configures it, trains it and tries it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.atropos.conftest import atropos_server
from tests.support.helpers import FINISHED, wait_for
from tests.support.reference_client.load import call, load_client


def test_the_reference_client_lists_configures_trains_and_tries_an_atropos_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, atropos_python: str
) -> None:
    with atropos_server(tmp_path / "var") as server:
        rl = load_client(monkeypatch, server.url)

        listed, _ = call(rl.rl_list_environments)
        mine = {e["name"]: e for e in listed["environments"]}["word_echo"]
        assert mine["framework"] == "atropos" and mine["class_name"] == "WordEchoEnv"

        selected, _ = call(rl.rl_select_environment, "word_echo")
        assert selected["selected"] == "word_echo", selected
        assert selected["file_path"].endswith("word_echo/word_echo_env.py")

        config, _ = call(rl.rl_get_current_config)
        assert "rollout_server_url" in config["locked_fields"], config
        assert config["configurable_fields"]["group_size"] == 4
        for field, value in [
            ("model_name", "tiny-random"),
            ("total_steps", 2),
            ("max_token_length", 8),
            ("wandb_name", "echo-trial"),
        ]:
            edited, _ = call(rl.rl_edit_config, field, value)
            assert "error" not in edited, edited
        refused, _ = call(rl.rl_edit_config, "tokenizer_name", "gpt2")
        assert refused["error"].startswith("HTTP 400") and "locked" in refused["error"]

        tried, _ = call(rl.rl_test_inference, ["Repeat this word: apple"], 8)
        assert "error" not in tried, tried
        (result,) = tried["results"]
        assert result["prompt"] == "Repeat this word: apple" and result["tokens"] <= 8
        assert result["score"] is None and "num_items" in result["reason"]

        started, _ = call(rl.rl_start_training)  # its defaults: lora_rank 32, lr 4e-5
        assert started.get("status") == "queued", started
        run_id = started["run_id"]

        def finished_run() -> dict[str, Any] | None:
            runs, _ = call(rl.rl_list_runs)
            run = next(r for r in runs if r["run_id"] == run_id)
            return run if run["status"] in FINISHED else None

        ended = wait_for(finished_run, 300, every=1.0)
        assert ended is not None and ended["status"] == "succeeded", ended
        status, _ = call(rl.rl_check_status, run_id)
        assert status["status"] == "succeeded" and status["step"] == 2, status
        assert status["metrics"]["reward_mean"] is not None

        results, _ = call(rl.rl_get_results, run_id)
        assert results["weights_path"] and results["history"], results
        assert results["metrics"]["percent_correct"] is not None

        stopped, _ = call(rl.rl_stop_training, run_id)
        assert stopped == {"run_id": run_id, "status": "succeeded"}

    # W&B offline (no key): the run's own W&B run, and the environment's in its group.
    run_dir = tmp_path / "var" / "runs" / run_id
    assert list((run_dir / "wandb").glob("offline-run-*"))
    assert list((run_dir / "atropos" / "wandb").glob("offline-run-*"))
