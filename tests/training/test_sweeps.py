"""A 2x2 sweep of real tiny-random runs ends with four results and a best run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import TINY_RUN, processes_with, wait_for
from tests.support.settings import make_settings
from tests.test_sweeps import wait_sweep


@pytest.fixture
def tclient(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(tmp_path, stop_grace_s=30.0))) as c:
        yield c
    wait_for(lambda: not processes_with(tmp_path / "var" / "runs"), 30)


def test_a_2x2_sweep_of_tiny_runs_ends_with_four_results_and_a_best_run(
    tclient: TestClient,
) -> None:
    resp = tclient.post(
        "/sweeps",
        json={
            "environment": "repeat_word",
            "base": {**TINY_RUN, "total_steps": 2, "save_every": 0, "steps_per_eval": 0},
            "grid": {"learning_rate": [0.01, 0.02], "seed": [0, 1]},
            "metric": "reward_mean",
        },
    )
    assert resp.status_code == 200, resp.text
    sweep_id, run_ids = resp.json()["sweep_id"], resp.json()["run_ids"]
    assert len(run_ids) == 4 and len(set(run_ids)) == 4

    done = wait_sweep(tclient, sweep_id)
    assert done["status"] == "finished" and done["runs_finished"] == 4
    assert done["counts"] == {"succeeded": 4}
    combos = sorted((r["overrides"]["learning_rate"], r["overrides"]["seed"]) for r in done["runs"])
    assert combos == [(0.01, 0), (0.01, 1), (0.02, 0), (0.02, 1)]
    for row in done["runs"]:
        assert row["status"] == "succeeded" and row["step"] == 2
        assert row["value"] is not None and row["metrics"]["reward_mean"] == row["value"]
        run = tclient.get(f"/runs/{row['run_id']}").json()
        assert run["sweep_id"] == sweep_id
        assert run["config"]["learning_rate"] == row["overrides"]["learning_rate"]
        assert run["config"]["seed"] == row["overrides"]["seed"]
        assert run["config"]["total_steps"] == 2  # from the base
    best = done["best"]
    assert best["value"] == max(r["value"] for r in done["runs"]) and best["final"] is True
    assert best["run_id"] in run_ids
    listed = tclient.get("/sweeps").json()
    assert [s["sweep_id"] for s in listed] == [sweep_id] and listed[0]["status"] == "finished"
