"""Webhooks, the slow tests: stopped, failed and stalled runs announced, a finished sweep
announced once, a restarted server delivering what was pending."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.webhooks.signing import verify
from tests import test_webhooks
from tests.support.helpers import run_of, start_run, wait_for
from tests.support.standins.webhook_receiver import WebhookReceiver
from tests.test_webhooks import add_webhook, deliveries, for_run, settings_for

# The fixtures these tests share with tests/test_webhooks.py, bound here where pytest looks.
client = test_webhooks.client
fake_runs = test_webhooks.fake_runs
receiver = test_webhooks.receiver


def test_stopped_failed_and_stalled_runs_are_announced(
    tmp_path: Path, fake_runs: None, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stalled: no step for longer than stall_min_s while the fake runner's one step takes 1.5 s.
    settings = settings_for(tmp_path, stall_min_s=0.3)
    with TestClient(create_app(settings)) as client:
        add_webhook(client, receiver.url, ["run.stalled", "run.failed", "run.stopped"])
        monkeypatch.setenv("FAKE_RUNNER_STEP_S", "1.5")
        slow = start_run(client, environment="arithmetic", total_steps=2)
        wait_for(lambda: for_run(receiver.received, slow), 30)
        client.post(f"/runs/{slow}/stop")
        wait_for(lambda: len(for_run(receiver.received, slow)) >= 2, 30)
        monkeypatch.setenv("FAKE_RUNNER_MODE", "crash")
        crashing = start_run(client, environment="arithmetic", total_steps=2)
        failed = lambda: [r.event for r in for_run(receiver.received, crashing)]  # noqa: E731
        wait_for(lambda: "run.failed" in failed(), 30)
        assert run_of(client, slow)["status"] == "stopped"
    got = for_run(receiver.received, slow)
    # Stalled once at step 0 (each tick sees the stall again; it is announced once), then
    # stopped; a stopping run is not stalled.
    assert [(r.event, r.json["step"]) for r in got][:1] == [("run.stalled", 0)]
    assert [r.event for r in got] == ["run.stalled", "run.stopped"]
    # The crash is announced; on a loaded machine the runner may sit past stall_min_s (0.3 s)
    # before it crashes, and then its stall is announced first.
    assert failed()[-1] == "run.failed" and set(failed()) <= {"run.stalled", "run.failed"}


def test_a_finished_sweep_is_announced_once(client: TestClient, receiver: WebhookReceiver) -> None:
    hook = add_webhook(client, receiver.url, ["sweep.finished"])
    resp = client.post(
        "/sweeps",
        json={"environment": "arithmetic", "base": {}, "grid": {"total_steps": [1, 2]}},
    )
    assert resp.status_code == 200, resp.text
    sweep_id = resp.json()["sweep_id"]
    wait_for(lambda: receiver.accepted(), 60)
    [got] = receiver.accepted()
    assert got.event == "sweep.finished" and got.json["sweep"]["sweep_id"] == sweep_id
    assert verify(hook["secret"], got.body, got.headers["x-rlcs-signature"])
    [row] = deliveries(client, hook["webhook_id"])
    assert row["order_key"] == sweep_id and row["status"] == "delivered"
    assert client.get(f"/sweeps/{sweep_id}").json()["finished_at"] is not None


def test_a_restarted_server_delivers_what_was_pending(
    tmp_path: Path, fake_runs: None, receiver: WebhookReceiver
) -> None:
    settings = settings_for(tmp_path)
    receiver.fail_all = True
    with TestClient(create_app(settings)) as first:
        hook = add_webhook(first, receiver.url, ["run.succeeded"])
        run_id = start_run(first, environment="arithmetic", total_steps=1)
        pending = wait_for(
            lambda: [d for d in deliveries(first, hook["webhook_id"]) if d["attempts"] >= 1], 30
        )
    [before] = pending
    assert before["status"] == "pending" and before["last_status_code"] == 500
    tried = len(receiver.received)
    receiver.fail_all = False
    with TestClient(create_app(settings)) as second:
        wait_for(lambda: receiver.accepted(), 30)
        [after] = deliveries(second, hook["webhook_id"])
    [got] = receiver.accepted()
    assert len(receiver.received) > tried  # tried again by the second server
    assert got.headers["x-rlcs-delivery"] == before["id"] == after["id"]
    assert after["status"] == "delivered" and after["attempts"] > before["attempts"]
    assert got.json["run"]["run_id"] == run_id
    # Signed with the secret the first server answered: the key outlived it in var_dir.
    assert verify(hook["secret"], got.body, got.headers["x-rlcs-signature"])
