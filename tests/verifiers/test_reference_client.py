"""Done when: a verifiers user drops their environment folder into a folder named in
RLCS_ENV_DIRS, and the reference client (tests/support/reference_client, unchanged) lists it,
configures it, tries it and trains it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import FINISHED, wait_for
from tests.support.reference_client.load import call, load_client
from tests.verifiers.conftest import verifiers_server


def test_the_reference_client_lists_configures_tries_and_trains_a_verifiers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verifiers_python: str
) -> None:
    with verifiers_server(tmp_path / "var") as server:
        rl = load_client(monkeypatch, server.url)

        listed, _ = call(rl.rl_list_environments)
        mine = {e["name"]: e for e in listed["environments"]}["reverse-word"]
        assert mine["framework"] == "verifiers" and mine["class_name"] == "load_environment"

        selected, _ = call(rl.rl_select_environment, "reverse-word")
        assert selected["selected"] == "reverse-word", selected
        assert selected["file_path"].endswith("reverse_word/reverse_word.py")

        config, _ = call(rl.rl_get_current_config)
        assert config["configurable_fields"]["num_examples"] == 8
        for field, value in [
            ("model_name", "tiny-random"),
            ("total_steps", 2),
            ("group_size", 2),
            ("max_tokens", 8),
            ("num_examples", 4),
            ("use_wandb", False),
        ]:
            edited, _ = call(rl.rl_edit_config, field, value)
            assert "error" not in edited, edited
        refused, _ = call(rl.rl_edit_config, "num_examples", "four")
        assert refused["error"].startswith("HTTP 422") and "num_examples" in refused["error"]

        tried, _ = call(rl.rl_test_inference, ["Write the word 'cat' backwards."], 8)
        assert "error" not in tried, tried
        (result,) = tried["results"]
        assert result["score"] is None and "num_items" in result["reason"]

        started, _ = call(rl.rl_start_training)
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
        results, _ = call(rl.rl_get_results, run_id)
        assert results["weights_path"] and results["history"], results
