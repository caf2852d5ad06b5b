"""Sweeps: a 2x2 grid of real tiny-random runs ends with four results and a best run; bad
combinations are refused before anything exists; waiting, listing, stopping, idempotency."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import end_run_leftovers, processes_with, wait_for
from tests.support.settings import make_settings

FAKE = "tests.support.fake_runners.runner"


@pytest.fixture
def fclient(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """Runs played by the fake runner (0.1 s a step): fast, for the API's own behaviour."""
    monkeypatch.setenv("FAKE_RUNNER_STEP_S", "0.1")
    monkeypatch.delenv("FAKE_RUNNER_MODE", raising=False)
    settings = make_settings(tmp_path, runner_module=FAKE, max_concurrent_runs=2)
    with TestClient(create_app(settings)) as c:
        yield c
    wait_for(lambda: not processes_with(tmp_path / "var" / "runs"), 20)
    end_run_leftovers(tmp_path / "var")


def wait_sweep(client: TestClient, sweep_id: str, timeout: float = 240.0) -> dict:
    """GET /sweeps/{id}/wait in server-side waits until every run has finished."""
    return wait_for(
        lambda: (
            (r := client.get(f"/sweeps/{sweep_id}/wait", params={"timeout": 30}).json())[
                "condition_met"
            ]
            and r
        ),
        timeout,
        every=0,
    )


def nothing_created(client: TestClient) -> None:
    assert client.get("/sweeps").json() == []
    assert client.get("/runs").json() == []


def test_a_bad_value_in_any_combination_is_refused_and_nothing_is_created(
    fclient: TestClient,
) -> None:
    unknown = fclient.post(
        "/sweeps",
        json={"environment": "arithmetic", "grid": {"learning_rat": [1e-5, 4e-5]}},
    )
    assert unknown.status_code == 422
    assert "learning_rat" in unknown.json()["detail"]
    nothing_created(fclient)

    out_of_bounds = fclient.post(
        "/sweeps",
        json={"environment": "arithmetic", "grid": {"lora_rank": [8, -1], "seed": [0]}},
    )
    assert out_of_bounds.status_code == 422
    detail = out_of_bounds.json()["detail"]
    assert "combination 2 of 2" in detail and "lora_rank" in detail and "-1" in detail
    nothing_created(fclient)

    bad_base = fclient.post(
        "/sweeps",
        json={"environment": "arithmetic", "base": {"total_steps": 0}, "grid": {"seed": [0]}},
    )
    assert bad_base.status_code == 422 and "total_steps" in bad_base.json()["detail"]

    huge = fclient.post(
        "/sweeps",
        json={
            "environment": "arithmetic",
            "grid": {"seed": list(range(100)), "learning_rate": [1e-5] * 10},
        },
    )
    assert huge.status_code == 422
    assert "1000 combinations" in huge.json()["detail"] and "max_runs" in huge.json()["detail"]
    both = fclient.post(
        "/sweeps", json={"environment": "arithmetic", "grid": {"seed": [0]}, "runs": [{}]}
    )
    assert both.status_code == 422 and "not both" in both.json()["detail"]
    varying_env = fclient.post(
        "/sweeps", json={"environment": "arithmetic", "runs": [{"environment": "repeat_word"}]}
    )
    assert varying_env.status_code == 422 and "environment" in varying_env.json()["detail"]
    nothing_created(fclient)


def test_max_runs_lets_a_large_sweep_through(fclient: TestClient) -> None:
    resp = fclient.post(
        "/sweeps",
        json={
            "environment": "arithmetic",
            "base": {"total_steps": 1},
            "runs": [{"seed": s} for s in range(120)],
            "max_runs": 120,
        },
    )
    assert resp.status_code == 200, resp.text
    sweep_id = resp.json()["sweep_id"]
    assert len(resp.json()["run_ids"]) == 120
    stopped = fclient.post(f"/sweeps/{sweep_id}/stop").json()
    assert stopped["sweep_id"] == sweep_id
    done = wait_sweep(fclient, sweep_id, 60)
    assert done["runs_total"] == 120 and set(done["counts"]) <= {"stopped", "succeeded"}


def test_waiting_stopping_and_the_idempotency_key(fclient: TestClient) -> None:
    body = {
        "environment": "arithmetic",
        "base": {"total_steps": 500},
        "runs": [{"seed": 0}, {"seed": 1}, {"seed": 2}],
    }
    headers = {"Idempotency-Key": "sweep-once"}
    first = fclient.post("/sweeps", json=body, headers=headers).json()
    again = fclient.post("/sweeps", json=body, headers=headers).json()
    assert again == first and len(fclient.get("/runs").json()) == 3
    sweep_id = first["sweep_id"]

    short = fclient.get(f"/sweeps/{sweep_id}/wait", params={"timeout": 0.3}).json()
    assert short["condition_met"] is False and short["status"] == "running"
    assert short["counts"].get("queued", 0) >= 1  # 2 slots, 3 runs

    wait_for(lambda: fclient.get(f"/sweeps/{sweep_id}").json()["counts"].get("running") == 2)
    stopped = fclient.post(f"/sweeps/{sweep_id}/stop").json()
    assert {r["run_id"] for r in stopped["runs"]} == set(first["run_ids"])
    done = wait_sweep(fclient, sweep_id, 60)
    assert done["counts"] == {"stopped": 3} and done["status"] == "finished"
    # The fake runner's reward grows with the step: the best is the run that got furthest.
    best = done["best"]
    if best is not None:
        furthest = max(done["runs"], key=lambda r: r["step"])
        assert best["value"] == furthest["value"] and best["final"] is True


def test_unknown_and_malformed_sweep_ids(fclient: TestClient) -> None:
    assert fclient.get("/sweeps/s-00000000").status_code == 404
    assert "GET /sweeps" in fclient.get("/sweeps/s-00000000").json()["detail"]
    assert fclient.get("/sweeps/nope").status_code == 422
    assert fclient.post("/sweeps/s-00000000/stop").status_code == 404
    assert fclient.get("/sweeps/s-00000000/wait").status_code == 404
