"""Webhooks: events of fake-runner runs reach a loopback receiver in order per run, signed
with the secret answered at creation; a failing receiver is retried with backoff (on an
injected clock too) until it accepts or the attempts run out; a restarted server delivers
what was pending, with the same delivery id; bad URLs and events get 422; no secret is
stored in the database."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args

import pytest
from fastapi.testclient import TestClient

from core import events
from core.db import make_engine, write_session
from core.models import RunEvent
from core.schema import upgrade
from core.settings import Settings
from server.app import create_app
from server.launch.leadership import Leadership
from server.runs.metrics import MetricsService
from server.runs.views import RunViews
from server.runs.wandb_reader import WandbReader
from server.webhooks.dispatch import WebhookDispatcher
from server.webhooks.fanout import FanOut
from server.webhooks.schemas import EventName
from server.webhooks.service import WebhookService, host_allowed
from server.webhooks.signing import KEY_FILE, signing_key, verify
from tests.support.helpers import end_run_leftovers, processes_with, start_run, wait_for
from tests.support.settings import make_settings
from tests.support.standins.webhook_receiver import Received, WebhookReceiver

FAKE = "tests.support.fake_runners.runner"
RUN_EVENTS = ["run.started", "run.step", "run.succeeded", "run.failed", "run.stopped"]


def settings_for(tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "runner_module": FAKE,
        "webhook_interval_s": 0.05,
        "webhook_retry_base_s": 0.2,
    }
    values.update(overrides)
    return make_settings(tmp_path, **values)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as rx:
        yield rx


@pytest.fixture
def fake_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("FAKE_RUNNER_STEP_S", "0.05")
    monkeypatch.delenv("FAKE_RUNNER_MODE", raising=False)
    yield
    wait_for(lambda: not processes_with(tmp_path / "var" / "runs"), 20)
    end_run_leftovers(tmp_path / "var")  # the `sleep` each fake runner leaves on purpose


@pytest.fixture
def client(tmp_path: Path, fake_runs: None) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(tmp_path))) as c:
        yield c


def add_webhook(client: TestClient, url: str, kinds: list[str], **extra: Any) -> dict[str, Any]:
    resp = client.post("/webhooks", json={"url": url, "events": kinds, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def for_run(received: list[Received], run_id: str, path: str | None = None) -> list[Received]:
    return [
        r
        for r in received
        if r.status == 204
        and r.json.get("run", {}).get("run_id") == run_id
        and (path is None or r.path == path)
    ]


def deliveries(client: TestClient, webhook_id: str, **params: Any) -> list[dict[str, Any]]:
    resp = client.get(f"/webhooks/{webhook_id}/deliveries", params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_event_names_agree() -> None:
    assert get_args(EventName) == events.EVENT_KINDS


def test_events_arrive_in_order_per_run_signed(
    client: TestClient, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    every = add_webhook(client, f"{receiver.url}/all", ["run.started", "run.step", "run.succeeded"])
    assert every["webhook_id"].startswith("wh-") and every["secret"].startswith("whsec_")
    evens = add_webhook(client, f"{receiver.url}/evens", ["run.step"], step_every=2)
    runs = [start_run(client, environment="arithmetic", total_steps=4) for _ in range(2)]

    def all_in() -> bool:
        got = receiver.received
        return all(
            len(for_run(got, r, "/all")) == 6 and len(for_run(got, r, "/evens")) == 2 for r in runs
        )

    wait_for(all_in, 60)
    for run_id in runs:
        got = for_run(receiver.received, run_id, "/all")
        assert [(r.event, r.json["step"]) for r in got] == [
            ("run.started", 0),
            ("run.step", 1),
            ("run.step", 2),
            ("run.step", 3),
            ("run.step", 4),
            ("run.succeeded", 4),
        ]
        for r in got:
            assert r.headers["content-type"] == "application/json"
            assert r.headers["x-rlcs-delivery"] == r.json["id"] and r.json["event"] == r.event
            assert verify(every["secret"], r.body, r.headers["x-rlcs-signature"])
            assert not verify(evens["secret"], r.body, r.headers["x-rlcs-signature"])
            assert not verify(every["secret"], r.body + b" ", r.headers["x-rlcs-signature"])
        step_two = got[2].json
        assert step_two["run"]["metrics"]["reward/mean"] == pytest.approx(0.2)
        assert step_two["run"]["environment"] == "arithmetic"
        assert step_two["run"]["total_steps"] == 4 and step_two["run"]["sweep_id"] is None
        assert [r.json["step"] for r in for_run(receiver.received, run_id, "/evens")] == [2, 4]

    # The deliveries API: every one delivered once, newest first, filterable.
    rows = deliveries(client, every["webhook_id"])
    assert len(rows) == 12 and {r["status"] for r in rows} == {"delivered"}
    assert all(r["attempts"] == 1 and r["last_status_code"] == 204 for r in rows)
    assert all(r["delivered_at"] and r["next_attempt_at"] is None for r in rows)
    assert rows[0]["event"] == "run.succeeded" and {r["order_key"] for r in rows} == set(runs)
    assert deliveries(client, every["webhook_id"], status="pending") == []
    assert len(deliveries(client, every["webhook_id"], status="delivered", limit=3)) == 3
    bad = client.get(f"/webhooks/{every['webhook_id']}/deliveries", params={"status": "lost"})
    assert bad.status_code == 422 and "status" in bad.json()["detail"]

    # The secret is shown once, stored nowhere: not in answers, not in the database's bytes.
    listed = client.get("/webhooks").json()
    assert {h["webhook_id"] for h in listed} == {every["webhook_id"], evens["webhook_id"]}
    assert "secret" not in json.dumps(listed)
    assert "secret" not in client.get(f"/webhooks/{every['webhook_id']}").json()
    key_file = tmp_path / "var" / KEY_FILE
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text().strip().encode()
    stored = b"".join(p.read_bytes() for p in (tmp_path / "var").glob("rlcs.db*"))
    assert every["webhook_id"].encode() in stored  # the scan does see the database's rows
    for secret in (every["secret"].encode(), evens["secret"].encode(), key):
        assert secret not in stored


def test_a_receiver_that_fails_twice_gets_the_third_try(
    client: TestClient, receiver: WebhookReceiver
) -> None:
    hook = add_webhook(client, f"{receiver.url}/hook", ["run.succeeded"])
    receiver.fail_next = 2
    run_id = start_run(client, environment="arithmetic", total_steps=1)
    wait_for(lambda: for_run(receiver.received, run_id), 30)
    tries = receiver.received
    assert [r.status for r in tries] == [500, 500, 204]
    assert len({r.headers["x-rlcs-delivery"] for r in tries}) == 1  # one delivery, three tries
    # Backoff: base 0.2 s, then 0.4 s (lower bounds; a tick may add a little).
    assert tries[1].at - tries[0].at >= 0.18 and tries[2].at - tries[1].at >= 0.38
    for r in tries:
        assert verify(hook["secret"], r.body, r.headers["x-rlcs-signature"])
    [row] = deliveries(client, hook["webhook_id"])
    assert row["id"] == tries[0].headers["x-rlcs-delivery"]
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("delivered", 3, 204)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://127.0.0.1/hook", "events": ["run.failed"]}, "url"),
        ({"url": "http://10.1.2.3/hook", "events": ["run.failed"]}, "url"),
        ({"url": "http://hooks.example.com/", "events": ["run.failed"]}, "url"),
        ({"url": "http://user:pw@127.0.0.1/", "events": ["run.failed"]}, "url"),
        ({"url": "not a url", "events": ["run.failed"]}, "url"),
        ({"url": "http://127.0.0.1:99999/", "events": ["run.failed"]}, "url"),
        ({"url": "http://127.0.0.1/", "events": ["run.finished"]}, "events"),
        ({"url": "http://127.0.0.1/", "events": []}, "events"),
        ({"url": "http://127.0.0.1/", "events": ["run.step"], "step_every": 0}, "step_every"),
        ({"url": "http://127.0.0.1/", "events": ["run.step"], "secret": "x"}, "secret"),
    ],
)
def test_bad_webhooks_are_refused_and_nothing_is_made(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    resp = client.post("/webhooks", json=body)
    assert resp.status_code == 422 and field in resp.json()["detail"], resp.text
    assert client.get("/webhooks").json() == []


def test_ids_unknown_or_malformed(client: TestClient, receiver: WebhookReceiver) -> None:
    for method, path in [
        ("GET", "/webhooks/wh-00000000"),
        ("DELETE", "/webhooks/wh-00000000"),
        ("GET", "/webhooks/wh-00000000/deliveries"),
    ]:
        resp = client.request(method, path)
        assert resp.status_code == 404 and "wh-00000000" in resp.json()["detail"], resp.text
    assert client.get("/webhooks/nope").status_code == 422
    hook = add_webhook(client, f"http://[::1]:{receiver.url.rsplit(':', 1)[1]}/", ["run.failed"])
    assert client.get(f"/webhooks/{hook['webhook_id']}").json()["url"].startswith("http://[::1]")
    gone = client.delete(f"/webhooks/{hook['webhook_id']}")
    assert gone.json() == {"webhook_id": hook["webhook_id"], "deleted": True}
    assert client.get(f"/webhooks/{hook['webhook_id']}").status_code == 404


def test_listed_hosts_are_allowed(tmp_path: Path) -> None:
    listed = ["10.1.2.3", "192.168.0.0/16", "Hooks.Example.com", "[fd00::1]"]
    with TestClient(create_app(make_settings(tmp_path, webhook_allowed_hosts=listed))) as client:
        for url in (
            "http://10.1.2.3/hook",
            "https://192.168.7.9:8443/",
            "https://hooks.example.com/x",
            "http://[fd00::1]/",
            "http://localhost:9/",
        ):
            assert (
                client.post("/webhooks", json={"url": url, "events": ["run.failed"]}).status_code
                == 200
            ), url
        refused = client.post(
            "/webhooks", json={"url": "http://10.1.2.4/", "events": ["run.failed"]}
        )
        assert (
            refused.status_code == 422 and "RLCS_WEBHOOK_ALLOWED_HOSTS" in refused.json()["detail"]
        )
        assert len(client.get("/webhooks").json()) == 5
    assert Settings(webhook_allowed_hosts="a.example, 10.0.0.0/8").webhook_allowed_hosts == [
        "a.example",
        "10.0.0.0/8",
    ]
    assert host_allowed("127.0.0.5", []) and host_allowed("::1", [])
    assert not host_allowed("hooks.example.com.evil", ["hooks.example.com"])


def test_backoff_and_giving_up_on_an_injected_clock(
    tmp_path: Path, receiver: WebhookReceiver, database_url: str
) -> None:
    """Retries wait base, 2 base, ... on the dispatcher's clock; after the last attempt the
    delivery fails and the next of the same run goes (on SQLite and PostgreSQL)."""
    settings = make_settings(
        tmp_path,
        database_url=database_url,
        webhook_retry_base_s=2.0,
        webhook_max_attempts=3,
        webhook_signing_key="k" * 32,
    )
    engine = make_engine(settings.db_url)
    upgrade(engine)
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    hooks = WebhookService(settings, engine, signing_key(settings))
    hook = hooks.create(receiver.url, ["run.step"])
    views = RunViews(settings, MetricsService(engine, WandbReader.from_settings(settings)))
    dispatcher = WebhookDispatcher(
        settings,
        engine,
        Leadership(engine),
        FanOut(engine, views, lambda: now[0]),
        hooks.secret,
        clock=lambda: now[0],
    )
    with write_session(engine) as session:
        for step in (1, 2):
            # Events a runner wrote (no run row is needed: the body then names the run only).
            at = now[0] + timedelta(seconds=1)
            session.add(RunEvent(kind="run.step", run_id="r-0000000a", step=step, created_at=at))
    # (seconds the clock moves before a tick, whether the receiver fails that tick)
    plan = [
        (1.0, True),
        (0.0, True),
        (1.9, True),
        (0.1, True),
        (4.0, True),
        (1.9, True),
        (0.1, False),
    ]

    async def ticks() -> list[int]:
        tried = []
        for advance, failing in plan:
            now[0] += timedelta(seconds=advance)
            receiver.fail_all = failing
            tried.append(await dispatcher.tick())
        await dispatcher.stop()
        return tried

    tried = asyncio.run(ticks())
    # Step 1: tried, waits 2 s, tried, waits 4 s, tried a third time and fails; step 2 goes in
    # the same tick (fails), waits 2 s, and is accepted.
    assert tried == [1, 0, 0, 1, 2, 0, 1]
    steps = [(r.json["step"], r.status) for r in receiver.received]
    assert steps == [(1, 500), (1, 500), (1, 500), (2, 500), (2, 204)]
    rows = hooks.deliveries(hook.webhook_id)  # newest first
    assert [(d.status, d.attempts) for d in rows] == [("delivered", 2), ("failed", 3)]
    assert rows[1].last_status_code == 500 and rows[1].last_error == "HTTP 500"
    last = receiver.received[-1]
    # The signature carries the dispatcher's (2030) time: fresh then, too old for today.
    header = last.headers["x-rlcs-signature"]
    assert verify(hook.secret, last.body, header, now=now[0].timestamp())
    assert not verify(hook.secret, last.body, header)
    engine.dispose()
