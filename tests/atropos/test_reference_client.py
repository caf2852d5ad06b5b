"""Done when: a tinker-atropos user drops their environment into a folder named in
RLCS_ENV_DIRS, and the reference client (tests/support/reference_client, unchanged) lists it,
configures it, trains it and tries it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.atropos.conftest import atropos_server
from tests.support.reference_client.load import call, load_client
from tests.support.reference_client.steps import (
    edit_config,
    select_listed,
    train_two_steps,
    try_unscored,
)


def test_the_reference_client_lists_configures_trains_and_tries_an_atropos_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, atropos_python: str
) -> None:
    with atropos_server(tmp_path / "var") as server:
        rl = load_client(monkeypatch, server.url)

        select_listed(
            rl,
            "word_echo",
            framework="atropos",
            class_name="WordEchoEnv",
            file_path_end="word_echo/word_echo_env.py",
        )

        config, _ = call(rl.rl_get_current_config)
        assert "rollout_server_url" in config["locked_fields"], config
        assert config["configurable_fields"]["group_size"] == 4
        edit_config(
            rl,
            [
                ("model_name", "tiny-random"),
                ("total_steps", 2),
                ("max_token_length", 8),
                ("wandb_name", "echo-trial"),
            ],
        )
        refused, _ = call(rl.rl_edit_config, "tokenizer_name", "gpt2")
        assert refused["error"].startswith("HTTP 400") and "locked" in refused["error"]

        result = try_unscored(rl, "Repeat this word: apple", 8)
        assert result["prompt"] == "Repeat this word: apple" and result["tokens"] <= 8

        run_id, status, results = train_two_steps(rl)  # its defaults: lora_rank 32, lr 4e-5
        assert status["metrics"]["reward_mean"] is not None
        assert results["metrics"]["percent_correct"] is not None

        stopped, _ = call(rl.rl_stop_training, run_id)
        assert stopped == {"run_id": run_id, "status": "succeeded"}

    # W&B offline (no key): the run's own W&B run, and the environment's in its group.
    run_dir = tmp_path / "var" / "runs" / run_id
    assert list((run_dir / "wandb").glob("offline-run-*"))
    assert list((run_dir / "atropos" / "wandb").glob("offline-run-*"))
