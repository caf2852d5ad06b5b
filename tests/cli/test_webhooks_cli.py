"""`rlctl webhooks` against a live server (fake runner) and a loopback receiver: add (the
secret printed once), list, deliveries, rm; a refused URL exits 1 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from server.webhooks.signing import verify
from tests.cli.conftest import Rlctl
from tests.support.helpers import end_run_leftovers, processes_with, wait_for
from tests.support.live_server import LiveServer
from tests.support.standins.webhook_receiver import WebhookReceiver

OK, SERVER_ERROR, USAGE = 0, 1, 2


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as rx:
        yield rx


def test_webhooks_add_list_deliveries_rm(
    rlctl: Rlctl, rlctl_in: Rlctl, receiver: WebhookReceiver, server: LiveServer
) -> None:
    added = rlctl(
        "--json", "webhooks", "add", f"{receiver.url}/hook",
        "--event", "run.succeeded", "--event", "run.step", "--step-every", "2",
    )  # fmt: skip
    assert added.returncode == OK, added.stderr
    hook = json.loads(added.stdout)
    hook_id = hook["webhook_id"]
    assert hook["events"] == ["run.step", "run.succeeded"] and hook["step_every"] == 2

    listed = rlctl_in("webhooks", "list")
    assert listed.returncode == OK and hook_id in listed.stdout and "run.step" in listed.stdout
    assert hook["secret"] not in listed.stdout

    started = rlctl_in("--json", "runs", "start", "--env", "arithmetic", "--set", "total_steps=2")
    run_id = json.loads(started.stdout)["run_id"]
    wait_for(lambda: len(receiver.accepted()) == 2, 60)
    got = receiver.accepted()
    assert [(r.event, r.json["step"]) for r in got] == [("run.step", 2), ("run.succeeded", 2)]
    assert all(r.json["run"]["run_id"] == run_id for r in got)
    assert all(verify(hook["secret"], r.body, r.headers["x-rlcs-signature"]) for r in got)

    rows = json.loads(rlctl_in("--json", "webhooks", "deliveries", hook_id).stdout)
    assert [(d["event"], d["status"], d["attempts"]) for d in rows] == [
        ("run.succeeded", "delivered", 1),
        ("run.step", "delivered", 1),
    ]
    shown = rlctl("webhooks", "deliveries", hook_id, "--status", "delivered")
    assert shown.returncode == OK and rows[0]["id"] in shown.stdout and "204" in shown.stdout
    pending = rlctl_in("webhooks", "deliveries", hook_id, "--status", "pending")
    assert pending.stdout.strip() == "no deliveries"

    removed = rlctl("webhooks", "rm", hook_id)
    assert removed.returncode == OK and f"{hook_id}  deleted" in removed.stdout
    assert rlctl_in("webhooks", "list").stdout.strip() == "no webhooks"
    again = rlctl_in("webhooks", "rm", hook_id)
    assert again.returncode == SERVER_ERROR and hook_id in again.stderr
    wait_for(lambda: not processes_with(server.var_dir / "runs" / run_id), 20)
    end_run_leftovers(server.var_dir)  # the `sleep` the fake runner leaves on purpose


def test_refused_webhooks(rlctl_in: Rlctl) -> None:
    bad_url = rlctl_in("webhooks", "add", "ftp://127.0.0.1/x", "--event", "run.failed")
    assert bad_url.returncode == SERVER_ERROR and "url" in bad_url.stderr
    far = rlctl_in("webhooks", "add", "http://10.1.2.3/", "--event", "run.failed")
    assert far.returncode == SERVER_ERROR and "RLCS_WEBHOOK_ALLOWED_HOSTS" in far.stderr
    unknown = rlctl_in("webhooks", "add", "http://127.0.0.1/", "--event", "run.done")
    assert unknown.returncode == USAGE and "run.done" in unknown.stderr
    assert rlctl_in("webhooks", "list").stdout.strip() == "no webhooks"
