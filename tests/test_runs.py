"""Runs as supervised subprocesses: lifecycle, stop, crashes, restarts, load (real processes)."""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from httpx_sse import connect_sse

from cli.client import Client
from cli.watch import follow_logs
from server.app import create_app
from tests.support.helpers import end_run_leftovers, pid_alive, processes_with, wait_for
from tests.support.settings import make_settings

FAKE = "tests.support.fake_runners.runner"
FINAL = {"succeeded", "failed", "stopped"}


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_RUNNER_STEP_S", "0.05")
    monkeypatch.delenv("FAKE_RUNNER_MODE", raising=False)
    return monkeypatch


@pytest.fixture(autouse=True)
def no_leftovers(tmp_path: Path) -> Iterator[None]:
    """Runs outlive their server by design, and a test may end with one still going: once it
    has ended, the `sleep` the fake runner leaves behind must not outlive the test."""
    yield
    var = tmp_path / "var"
    if not (var / "runs").is_dir():
        return
    wait_for(lambda: not processes_with(var / "runs"), 20)  # fake runs end within seconds
    end_run_leftovers(var)


@pytest.fixture
def rclient(tmp_path: Path, fake_env):
    settings = make_settings(tmp_path, runner_module=FAKE, stop_grace_s=1.5)
    with TestClient(create_app(settings)) as c:
        c.post("/environments/arithmetic/select")
        yield c


def final(client, run_id: str, timeout: float = 20.0) -> dict:
    return wait_for(
        lambda: (r := client.get(f"/runs/{run_id}").json())["status"] in FINAL and r, timeout
    )


def start(client, **body) -> str:
    resp = client.post("/runs", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "queued"
    return resp.json()["run_id"]


def test_run_succeeds_with_frozen_config(rclient: TestClient, tmp_path: Path) -> None:
    run_id = start(rclient, total_steps=5, lora_rank=8, wandb_project="p", learning_rate=1e-4)
    run = final(rclient, run_id)
    assert run["status"] == "succeeded", run
    assert run["step"] == 5 and run["total_steps"] == 5
    assert run["metrics"]["reward_mean"] == 0.5 and run["metrics_source"] == "local"
    assert run["error"] is None
    # The runner records its end just before it exits; the supervisor then adds the exit code.
    assert wait_for(lambda: rclient.get(f"/runs/{run_id}").json()["exit_code"] == 0)
    assert run["started_at"] and run["finished_at"]
    frozen = json.loads((tmp_path / "var" / "runs" / run_id / "config.json").read_text())
    assert frozen["config"]["lora_rank"] == 8 and frozen["config_hash"] == run["config_hash"]
    # Editing the config later changes nothing about the run that exists.
    rclient.post("/config", json={"field": "lora_rank", "value": 4})
    again = json.loads((tmp_path / "var" / "runs" / run_id / "config.json").read_text())
    assert again == frozen
    listed = rclient.get("/runs").json()
    assert listed[0]["run_id"] == run_id
    logs = rclient.get(f"/runs/{run_id}/logs", params={"tail": 2}).json()
    assert logs["lines"] == ["step 5", "done"]


def test_list_is_newest_first_and_filters(rclient: TestClient) -> None:
    ids = [start(rclient, total_steps=1) for _ in range(3)]
    for run_id in ids:
        final(rclient, run_id)
    listed = [r["run_id"] for r in rclient.get("/runs").json()]
    assert listed == list(reversed(ids))
    assert rclient.get("/runs", params={"status": "succeeded"}).json()
    assert rclient.get("/runs", params={"status": "failed"}).json() == []
    assert rclient.get("/runs", params={"environment": "guess_number"}).json() == []
    assert rclient.get("/runs", params={"status": "bogus"}).status_code == 422


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"lora_rank": 0}, "lora_rank"),
        ({"lora_rank": "big"}, "lora_rank"),
        # Above the local engine's largest (RLCS_MAX_LORA_RANK, 128): refused before any run.
        ({"lora_rank": 256}, "RLCS_MAX_LORA_RANK"),
        ({"no_such": 1}, "no_such"),
        ({"tokenizer_name": "x"}, "tokenizer_name"),
        ({"environment": "nope"}, "nope"),
        # loss_fn_config is checked per loss at the request, not by the backend mid-run.
        ({"loss_fn": "ppo", "loss_fn_config": {"clip_ratio": 0.2}}, "'clip_ratio'"),
        ({"loss_fn_config": {"beta": 0.1}}, "'beta' for loss 'importance_sampling'"),
        ({"loss_fn": "dro", "loss_fn_config": {"beta": -1.0}}, "loss_fn_config"),
        ({"model_name": "./no/such/folder"}, "model_name"),
    ],
)
def test_invalid_overrides_leave_nothing(
    rclient: TestClient, tmp_path: Path, body: dict, needle: str
) -> None:
    resp = rclient.post("/runs", json=body)
    assert 400 <= resp.status_code < 500 and needle in resp.json()["detail"], resp.text
    if "loss_fn_config" in body or "model_name" in body or body.get("lora_rank") == 256:
        assert resp.status_code == 422
    assert rclient.get("/runs").json() == []
    runs_dir = tmp_path / "var" / "runs"
    assert not runs_dir.exists() or list(runs_dir.iterdir()) == []


def test_no_environment_selected_is_400(tmp_path: Path, fake_env) -> None:
    with TestClient(create_app(make_settings(tmp_path, runner_module=FAKE))) as c:
        resp = c.post("/runs", json={})
        assert resp.status_code == 400 and "select" in resp.json()["detail"]
        assert (
            c.post("/runs", json={"environment": "arithmetic", "total_steps": 1}).status_code == 200
        )


def test_reference_client_body_and_empty_body(rclient: TestClient) -> None:
    run_id = start(rclient, wandb_project="rl-training", lora_rank=32, learning_rate=4e-5)
    assert rclient.post("/runs").status_code == 200  # no body at all
    rclient.post(f"/runs/{run_id}/stop")


def test_idempotency_key_returns_the_same_run(rclient: TestClient) -> None:
    headers = {"Idempotency-Key": "abc-123"}
    first = rclient.post("/runs", json={"total_steps": 1}, headers=headers).json()
    second = rclient.post("/runs", json={"total_steps": 1}, headers=headers).json()
    assert first["run_id"] == second["run_id"]
    assert len(rclient.get("/runs").json()) == 1


@pytest.mark.parametrize(
    ("run_id", "status"),
    [("r-00000000", 404), ("nonsense", 422), ("r-..%2F..%2Fx", 404), ("R-ABCDEF12", 422)],
)
def test_unknown_or_malformed_run_ids(rclient: TestClient, run_id: str, status: int) -> None:
    assert rclient.get(f"/runs/{run_id}").status_code == status
    assert rclient.post(f"/runs/{run_id}/stop").status_code == status
    assert rclient.get(f"/runs/{run_id}/logs").status_code == status


def test_stop_leaves_no_process_of_the_group(rclient: TestClient, tmp_path: Path, fake_env) -> None:
    fake_env.setenv("FAKE_RUNNER_STEP_S", "0.5")
    run_id = start(rclient, total_steps=100)
    running = wait_for(lambda: (r := rclient.get(f"/runs/{run_id}").json())["step"] >= 1 and r)
    grandchild = int((tmp_path / "var" / "runs" / run_id / "grandchild.pid").read_text())
    resp = rclient.post(f"/runs/{run_id}/stop")
    assert resp.json()["status"] == "stopping"
    run = final(rclient, run_id)
    assert run["status"] == "stopped" and run["details"].startswith("stopped at step")
    wait_for(lambda: rclient.get(f"/runs/{run_id}").json()["exit_code"] == 0, 5)
    assert not pid_alive(running["pid"]) and not pid_alive(grandchild)
    # Idempotent: stopping a finished run answers its final status.
    again = rclient.post(f"/runs/{run_id}/stop")
    assert again.status_code == 200 and again.json()["status"] == "stopped"


def test_stop_of_queued_run_cancels_it(tmp_path: Path, fake_env) -> None:
    fake_env.setenv("FAKE_RUNNER_STEP_S", "0.5")
    settings = make_settings(tmp_path, runner_module=FAKE, max_concurrent_runs=1)
    with TestClient(create_app(settings)) as c:
        c.post("/environments/arithmetic/select")
        busy = start(c, total_steps=100)
        waiting = start(c, total_steps=1)
        wait_for(lambda: c.get(f"/runs/{busy}").json()["status"] == "running")
        info = c.get(f"/runs/{waiting}").json()
        assert info["status"] == "queued" and "waiting for a slot" in info["details"]
        assert c.post(f"/runs/{waiting}/stop").json()["status"] == "stopped"
        assert c.get(f"/runs/{waiting}").json()["pid"] is None
        c.post(f"/runs/{busy}/stop")
        final(c, busy)


def test_kill_9_of_runner_is_reported_with_the_signal(rclient: TestClient, fake_env) -> None:
    fake_env.setenv("FAKE_RUNNER_STEP_S", "0.5")
    run_id = start(rclient, total_steps=100)
    running = wait_for(lambda: (r := rclient.get(f"/runs/{run_id}").json())["step"] >= 1 and r)
    os.kill(running["pid"], signal.SIGKILL)
    run = final(rclient, run_id, timeout=15)
    assert run["status"] == "failed" and run["failure_kind"] == "killed"
    assert "SIGKILL" in run["error"] and "step 1" in run["error"]  # the log tail


def test_crash_is_failed_with_log_tail(rclient: TestClient, fake_env) -> None:
    fake_env.setenv("FAKE_RUNNER_MODE", "crash")
    run = final(rclient, start(rclient, total_steps=3))
    assert run["status"] == "failed" and run["failure_kind"] == "crash"
    assert run["exit_code"] == 3 and "fails on purpose" not in run["error"][:0]
    assert "crashes on purpose" in run["error"]


def test_exit_zero_without_an_end_is_not_success(rclient: TestClient, fake_env) -> None:
    fake_env.setenv("FAKE_RUNNER_MODE", "no_end")
    run = final(rclient, start(rclient, total_steps=2))
    assert run["status"] == "failed" and run["failure_kind"] == "no_end"


def test_default_runner_command_is_the_training_runner(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    assert settings.runner_module == "runners.train"


def test_logs_follow_streams_and_ends_with_status(rclient: TestClient, fake_env) -> None:
    fake_env.setenv("FAKE_RUNNER_STEP_S", "0.1")
    run_id = start(rclient, total_steps=5)
    events = []
    with rclient.stream("GET", f"/runs/{run_id}/logs", params={"follow": True, "tail": 0}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, line[6:]))
    lines = [data for kind, data in events if kind == "line"]
    assert "step 5" in lines and "done" in lines
    assert events[-1][0] == "end" and json.loads(events[-1][1])["status"] == "succeeded"


def test_logs_follow_hands_carriage_returns_to_a_standard_client(
    rclient: TestClient, fake_env, capsys: pytest.CaptureFixture[str]
) -> None:
    """A progress bar's bare CR is a line end in the SSE spec: it reaches a standard client
    (httpx-sse) as the LF between two data lines of the one event, and a CRLF ends a line."""
    fake_env.setenv("FAKE_RUNNER_STEP_S", "0.3")
    fake_env.setenv("FAKE_RUNNER_PROGRESS", "1")
    run_id = start(rclient, total_steps=3)
    url, params = f"/runs/{run_id}/logs", {"follow": True, "tail": 1000}

    def follow() -> list[tuple[str, str]]:
        with connect_sse(rclient, "GET", url, params=params) as source:
            return [(event.event, event.data) for event in source.iter_sse()]

    during = follow()  # from the start of the run: its tail, then lines as they are written
    expected = [f"fake runner {run_id} up, mode=steps"]
    for step in (1, 2, 3):
        expected += [
            f"batch {step}: 50%\rbatch {step}: 100%",
            f"windows line {step}",
            f"step {step}",
        ]
    expected.append("done")
    for events in (during, follow()):  # and once more when every line comes from the tail
        assert events[-1][0] == "end" and json.loads(events[-1][1])["status"] == "succeeded"
        assert [data.replace("\n", "\r") for kind, data in events[:-1]] == expected
        assert {kind for kind, _ in events[:-1]} == {"line"}
        assert events[1] == ("line", "batch 1: 50%\nbatch 1: 100%")
    assert rclient.get(url, params={"tail": 1000}).json()["lines"] == expected

    # rlctl reads the same stream through httpx-sse and gives each line back exactly.
    cli = Client("http://testserver", None)
    cli._http = rclient
    capsys.readouterr()
    assert follow_logs(cli, argparse.Namespace(run=run_id, tail=1000, json=True)) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [event["data"] for event in printed[:-1]] == expected
    assert printed[-1]["event"] == "end"


def test_log_streams_per_client_are_bounded(tmp_path: Path, fake_env) -> None:
    fake_env.setenv("FAKE_RUNNER_STEP_S", "0.5")
    settings = make_settings(tmp_path, runner_module=FAKE, max_streams_per_client=2)
    with TestClient(create_app(settings)) as c:
        c.post("/environments/arithmetic/select")
        run_id = start(c, total_steps=100)
        url, params = f"/runs/{run_id}/logs", {"follow": True, "tail": 0}
        with c.stream("GET", url, params=params) as first, c.stream("GET", url, params=params):
            assert first.status_code == 200
            third = c.get(url, params=params)
            assert third.status_code == 429
            assert "RLCS_MAX_STREAMS_PER_CLIENT" in third.json()["detail"]
            assert c.get(url, params={"tail": 5}).status_code == 200  # plain reads still work

        def opens() -> bool:
            with c.stream("GET", url, params=params) as again:
                return again.status_code == 200

        wait_for(opens, 10)  # closed streams gave their places back
        c.post(f"/runs/{run_id}/stop")
        final(c, run_id)
