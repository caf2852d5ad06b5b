"""The steps the reference client's end-to-end tests all take, through its unchanged tools:
edit the config, start the run, and poll the run list until the run has finished."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tests.support.helpers import FINISHED, wait_for
from tests.support.reference_client.load import call


def edit_config(rl: ModuleType, edits: list[tuple[str, Any]]) -> None:
    """Set each field to its value; every edit is accepted."""
    for field, value in edits:
        edited, _ = call(rl.rl_edit_config, field, value)
        assert "error" not in edited, edited


def start_training(rl: ModuleType) -> str:
    """Start a run on the current config; it is queued. Its id."""
    started, _ = call(rl.rl_start_training)
    assert started.get("status") == "queued", started
    run_id: str = started["run_id"]
    return run_id


def finished_run(
    rl: ModuleType, run_id: str, timeout: float, every: float
) -> dict[str, Any] | None:
    """The run's row in the run list once it has finished (rl_list_runs is not rate-limited,
    unlike rl_check_status)."""

    def finished() -> dict[str, Any] | None:
        runs, _ = call(rl.rl_list_runs)
        run = next(r for r in runs if r["run_id"] == run_id)
        return run if run["status"] in FINISHED else None

    return wait_for(finished, timeout, every=every)


def select_listed(
    rl: ModuleType, name: str, *, framework: str, class_name: str, file_path_end: str
) -> None:
    """The environment is listed, from its framework and by its class (or loader), and
    selecting it selects the file it was found in."""
    listed, _ = call(rl.rl_list_environments)
    mine = {e["name"]: e for e in listed["environments"]}[name]
    assert mine["framework"] == framework and mine["class_name"] == class_name
    selected, _ = call(rl.rl_select_environment, name)
    assert selected["selected"] == name, selected
    assert selected["file_path"].endswith(file_path_end)


def try_unscored(rl: ModuleType, prompt: str, max_tokens: int) -> dict[str, Any]:
    """rl_test_inference on one prompt answers it, unscored: a framework environment scores
    a group, never one completion. The answer's one result."""
    tried, _ = call(rl.rl_test_inference, [prompt], max_tokens)
    assert "error" not in tried, tried
    (result,) = tried["results"]
    assert result["score"] is None and "num_items" in result["reason"]
    return dict(result)


def train_two_steps(rl: ModuleType) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Start a run on the current config (two steps) and let it succeed; its id, its status
    and its results."""
    run_id = start_training(rl)
    ended = finished_run(rl, run_id, 300, every=1.0)
    assert ended is not None and ended["status"] == "succeeded", ended
    status, _ = call(rl.rl_check_status, run_id)
    assert status["status"] == "succeeded" and status["step"] == 2, status
    results, _ = call(rl.rl_get_results, run_id)
    assert results["weights_path"] and results["history"], results
    return run_id, status, results
