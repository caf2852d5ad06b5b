"""`rlctl` against a live server, the slow tests: a run's whole lifecycle, `runs wait`, and
inference with tiny-random."""

from __future__ import annotations

import json

from tests.cli.conftest import Rlctl
from tests.cli.test_cli import OK, SERVER_ERROR, ok_json, parallel, start_run


def test_run_lifecycle(rlctl: Rlctl, rlctl_in: Rlctl) -> None:
    rlctl_in("envs", "select", "arithmetic")
    args = ("--set", "total_steps=10", "--set", "lora_rank=8", "--idempotency-key", "cli-test-1")
    run_id = start_run(rlctl, *args)
    assert start_run(rlctl_in, *args) == run_id  # the same key is the same run
    started = rlctl_in("runs", "start", *args)
    assert started.stdout.split()[0] == run_id and f"rlctl runs watch {run_id}" in started.stdout

    watched = rlctl("runs", "watch", run_id, "--interval", "0.2")
    assert watched.returncode == OK, watched.stderr
    lines = watched.stdout.splitlines()
    assert "\r" not in watched.stdout  # not a TTY: a line per change
    assert lines[-2].startswith(f"{run_id}  succeeded  [{'#' * 24}]  10/10  100%")
    assert lines[-1] == f"run {run_id} succeeded at step 10/10"

    results = parallel(
        lambda args: rlctl(*args),
        [
            ["--json", "runs", "list", "--status", "succeeded", "--env", "arithmetic"],
            ["runs", "status", run_id, "--json"],
            ["runs", "metrics", run_id],
            ["--json", "runs", "history", run_id, "--keys", "reward/mean"],
            ["runs", "checkpoints", run_id],
            ["runs", "logs", run_id, "--tail", "2"],
            ["runs", "status", "nonsense"],
            ["runs", "resume", run_id, "--set", "total_steps=12", "--force"],
        ],
    )
    listed, status, metrics, history, checkpoints, logs, malformed, resumed = results
    assert run_id in [r["run_id"] for r in ok_json(listed)]
    assert ok_json(status)["status"] == "succeeded" and ok_json(status)["step"] == 10
    assert metrics.returncode == OK and "reward/mean" in metrics.stdout
    assert [row["reward/mean"] for row in ok_json(history)["rows"]][:3] == [0.1, 0.2, 0.3]
    assert checkpoints.returncode == OK and checkpoints.stdout.strip() == "no checkpoints"
    assert logs.returncode == OK and logs.stdout.splitlines() == ["step 10", "done"]
    assert malformed.returncode == SERVER_ERROR and malformed.stdout == ""
    assert "HTTP 422" in malformed.stderr and "run_id" in malformed.stderr
    # The fake runner writes no checkpoint, so a resume is a conflict the server explains.
    assert resumed.returncode == SERVER_ERROR and "HTTP 409" in resumed.stderr
    assert "checkpoint" in resumed.stderr

    table = rlctl_in("runs", "list")
    assert table.stdout.split()[:4] == ["RUN", "ENVIRONMENT", "STATUS", "STEP"]
    assert run_id in table.stdout
    assert ok_json(rlctl_in("--json", "runs", "list", "--status", "failed", "--env", "x")) == []
    assert "SOURCE" in table.stdout.splitlines()[0]
    assert ok_json(rlctl_in("--json", "runs", "list", "--source", "tinker-api")) == []
    assert run_id in [
        r["run_id"] for r in ok_json(rlctl_in("--json", "runs", "list", "--source", "api"))
    ]
    human = rlctl_in("runs", "status", run_id).stdout
    assert "succeeded (attempt 1)" in human and "10/10 (100%)" in human
    # What it spent (the fake runner charges 0.1 device seconds and 80 tokens a step).
    assert "COST" in table.stdout.splitlines()[0]
    (row,) = [line for line in table.stdout.splitlines() if line.startswith(run_id)]
    assert "0.001 USD" in row
    assert "300 prefill, 100 sampled, 400 trained" in human and "on cpu" in human
    assert "0.001 USD" in human and "RLCS_PRICE_DEVICE_HOUR 3.6 USD/h" in human
    results_json = ok_json(rlctl_in("--json", "runs", "metrics", run_id))
    assert results_json["final"] is True and len(results_json["history"]) == 10
    history_table = rlctl_in("runs", "history", run_id).stdout
    assert history_table.split()[:3] == ["step", "reward/mean", "train/loss"]
    assert ok_json(rlctl_in("--json", "runs", "checkpoints", run_id)) == []
    assert ok_json(rlctl_in("--json", "runs", "logs", run_id, "--tail", "1"))["lines"] == ["done"]
    missing = rlctl_in("runs", "status", "r-00000000")
    assert missing.returncode == SERVER_ERROR and "HTTP 404" in missing.stderr

    stopped = rlctl("runs", "stop", run_id)  # idempotent on a finished run
    assert stopped.returncode == OK and stopped.stdout.split() == [run_id, "succeeded"]
    stopped = ok_json(rlctl_in("--json", "runs", "stop", run_id))
    assert stopped == {"run_id": run_id, "status": "succeeded"}


def test_infer_with_tiny_random(rlctl: Rlctl, rlctl_in: Rlctl) -> None:
    rlctl_in("envs", "select", "arithmetic")
    assert rlctl_in("config", "set", "model_name", "tiny-random").returncode == OK
    answer = ok_json(
        rlctl("--json", "infer", "What is 2 + 2?", "--max-tokens", "4", "--temperature", "0.5")
    )
    assert answer["model"] == "tiny-random" and answer["environment"] == "arithmetic"
    assert [r["prompt"] for r in answer["results"]] == ["What is 2 + 2?"]
    human = rlctl_in(
        "infer", "--items", "2", "--max-tokens", "4", "--seed", "1", "--env", "arithmetic"
    )
    assert human.returncode == OK, human.stderr
    assert "[2] score" in human.stdout and "summary  count 2" in human.stdout
    bad = rlctl_in("infer", "hi", "--step", "3")  # checkpoint_step without a run: the server says
    assert bad.returncode == SERVER_ERROR and "run_id" in bad.stderr


def test_runs_wait_blocks_until_the_end_or_its_timeout(rlctl: Rlctl) -> None:
    run_id = start_run(rlctl, "--env", "arithmetic", "--set", "total_steps=5")
    done = rlctl("--json", "runs", "wait", run_id, "--at-most", "60")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "succeeded"
    long = start_run(rlctl, "--env", "arithmetic", "--set", "total_steps=300")
    early = rlctl("runs", "wait", long, "--until", "step:100000", "--at-most", "0.5")
    assert early.returncode == 5 and long in early.stdout
    rlctl("runs", "stop", long)
    bad = rlctl("runs", "wait", long, "--until", "soon")
    assert bad.returncode == 1 and "until" in bad.stderr
