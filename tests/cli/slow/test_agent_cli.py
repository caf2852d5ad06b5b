"""`rlctl sweeps ...` against a live server with the fake runner, the slow tests: a sweep from
start to its best run, and the refusals and stop of a running one."""

from __future__ import annotations

import json

from tests.cli.conftest import Rlctl


def test_a_sweep_from_start_to_its_best_run(rlctl: Rlctl) -> None:
    start = ["sweeps", "start", "--env", "arithmetic", "--grid", "seed=0,1"]
    start += ["--grid", "total_steps=2,4", "--idempotency-key", "cli-sweep"]
    started = rlctl("--json", *start)
    assert started.returncode == 0, started.stderr
    answer = json.loads(started.stdout)
    assert len(answer["run_ids"]) == 4
    waited = rlctl("sweeps", "wait", answer["sweep_id"], "--at-most", "60")
    assert waited.returncode == 0, waited.stderr
    # The fake runner's reward is step/10: the 4-step runs are best.
    assert "best (max reward_mean)" in waited.stdout and "total_steps=4" in waited.stdout
    shown = json.loads(rlctl("--json", "sweeps", "show", answer["sweep_id"]).stdout)
    assert shown["best"]["overrides"]["total_steps"] == 4 and shown["best"]["value"] == 0.4
    listed = rlctl("sweeps", "list")
    assert answer["sweep_id"] in listed.stdout and "finished" in listed.stdout
    again = rlctl("--json", *start)
    assert json.loads(again.stdout) == answer


def test_sweep_refusals_and_stop(rlctl: Rlctl) -> None:
    refused = rlctl("sweeps", "start", "--env", "arithmetic", "--grid", "lora_rank=8,-1")
    assert refused.returncode == 1 and "lora_rank" in refused.stderr
    assert "Nothing was created" in refused.stderr
    assert rlctl("sweeps", "start", "--env", "arithmetic").returncode == 2  # no --grid
    started = json.loads(
        rlctl(
            "--json",
            "sweeps",
            "start",
            "--env",
            "arithmetic",
            "--grid",
            "seed=0,1",
            "--set",
            "total_steps=1000",
        ).stdout
    )
    stopped = rlctl("sweeps", "stop", started["sweep_id"])
    assert stopped.returncode == 0 and "2 unfinished runs" in stopped.stdout
    done = rlctl("--json", "sweeps", "wait", started["sweep_id"], "--at-most", "60")
    assert json.loads(done.stdout)["counts"] == {"stopped": 2}
