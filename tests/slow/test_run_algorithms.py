"""Run references (kl_reference, teacher) checked against the database and pinned to their
step, on the fake runner's finished runs (fast refusals: tests/test_run_algorithms.py)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests import test_run_algorithms
from tests.test_run_algorithms import finished_run, frozen, refused

# The fixture these tests share with tests/test_run_algorithms.py, bound here where pytest looks.
aclient = test_run_algorithms.aclient


def test_run_references_are_checked_and_pinned(aclient: TestClient, tmp_path: Path) -> None:
    teacher = finished_run(aclient, tmp_path, "tiny-random", [2, 5])
    bare = finished_run(aclient, tmp_path, "tiny-random", [])
    hosted = finished_run(aclient, tmp_path, "tiny-random", [4], remote=True)
    other = finished_run(aclient, tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct", [1])

    # A run's newest checkpoint is pinned to its step in the frozen config; a step is kept.
    body = {"model_name": "tiny-random", "total_steps": 1, "teacher": teacher}
    made = aclient.post("/runs", json={**body, "kl_penalty_coef": 0.1, "kl_reference": teacher})
    assert made.status_code == 200, made.text
    config = frozen(tmp_path, made.json()["run_id"])
    assert config["teacher"] == config["kl_reference"] == f"{teacher}@step-5"
    at_two = aclient.post("/runs", json={**body, "teacher": f"{teacher}@step-2"})
    assert frozen(tmp_path, at_two.json()["run_id"])["teacher"] == f"{teacher}@step-2"
    # A model name is a teacher too, checked as the backend would load it.
    named = aclient.post("/runs", json={**body, "teacher": "tiny-random", "reward_coef": 0})
    assert named.status_code == 200, named.text

    refused(aclient, tmp_path, {**body, "teacher": f"{teacher}@step-3"}, "teacher", "2, 5")
    refused(aclient, tmp_path, {**body, "teacher": bare}, "teacher", "none yet")
    refused(aclient, tmp_path, {**body, "teacher": hosted}, "teacher", "saved on Tinker")
    refused(
        aclient,
        tmp_path,
        {**body, "kl_penalty_coef": 0.1, "kl_reference": f"{other}@step-1"},
        "kl_reference",
        "must share the run's base model",
    )
