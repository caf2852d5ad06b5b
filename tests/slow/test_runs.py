"""Runs as supervised subprocesses, the slow tests: stalls, SIGKILL after the grace, fifty
starts, a server killed and restarted."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from core.db import make_engine, read_session
from core.models import ACTIVE, Run
from server.app import create_app
from tests import test_runs
from tests.support.helpers import pid_alive, run_leftovers, wait_for
from tests.support.live_server import LiveServer
from tests.support.settings import make_settings
from tests.test_runs import FAKE, FINAL, final, start

# The fixtures these tests share with tests/test_runs.py, bound here where pytest looks.
fake_env = test_runs.fake_env
no_leftovers = test_runs.no_leftovers
rclient = test_runs.rclient


def test_stop_escalates_to_sigkill_after_grace(
    rclient: TestClient, tmp_path: Path, fake_env
) -> None:
    fake_env.setenv("FAKE_RUNNER_MODE", "ignore_term")
    fake_env.setenv("FAKE_RUNNER_STEP_S", "0.5")
    run_id = start(rclient, total_steps=100)
    running = wait_for(lambda: (r := rclient.get(f"/runs/{run_id}").json())["step"] >= 1 and r)
    grandchild = int((tmp_path / "var" / "runs" / run_id / "grandchild.pid").read_text())
    began = time.monotonic()
    rclient.post(f"/runs/{run_id}/stop")
    run = final(rclient, run_id)
    assert time.monotonic() - began >= 1.4  # the grace period was honoured
    assert run["status"] == "stopped" and "SIGKILL" in run["details"]
    assert not pid_alive(running["pid"]) and not pid_alive(grandchild)


def test_stall_is_flagged(tmp_path: Path, fake_env) -> None:
    fake_env.setenv("FAKE_RUNNER_STEP_S", "2.5")
    settings = make_settings(tmp_path, runner_module=FAKE, stall_min_s=0.5, stall_factor=2.0)
    with TestClient(create_app(settings)) as c:
        c.post("/environments/arithmetic/select")
        run_id = start(c, total_steps=100)
        run = wait_for(lambda: (r := c.get(f"/runs/{run_id}").json())["stalled"] and r, 10)
        assert run["status"] == "running" and "no step for" in run["stall_details"]
        c.post(f"/runs/{run_id}/stop")
        final(c, run_id)


def test_server_kill_9_then_restart_adopts_the_run(tmp_path: Path, fake_env) -> None:
    var = tmp_path / "var"
    env = {"RLCS_RUNNER_MODULE": FAKE, "FAKE_RUNNER_STEP_S": "0.3"}
    server = LiveServer(var, **env).start()
    try:
        httpx.post(f"{server.url}/environments/arithmetic/select")
        adopted = httpx.post(f"{server.url}/runs", json={"total_steps": 12}).json()["run_id"]
        doomed = httpx.post(f"{server.url}/runs", json={"total_steps": 100}).json()["run_id"]
        pids = {}
        for run_id in (adopted, doomed):
            pids[run_id] = wait_for(
                lambda rid=run_id: (
                    httpx.get(f"{server.url}/runs/{rid}").json()["step"] >= 1
                    and httpx.get(f"{server.url}/runs/{rid}").json()["pid"]
                )
            )
        server.kill(signal.SIGKILL)
        assert pid_alive(pids[adopted])  # the server's death did not kill the runs
        os.kill(pids[doomed], signal.SIGKILL)  # this one dies while nobody watches
        wait_for(lambda: not pid_alive(pids[doomed]))
        server = LiveServer(var, **env).start()
        done = wait_for(
            lambda: (
                (r := httpx.get(f"{server.url}/runs/{adopted}").json())["status"] in FINAL and r
            ),
            20,
        )
        assert done["status"] == "succeeded" and done["step"] == 12
        lost = httpx.get(f"{server.url}/runs/{doomed}").json()
        assert lost["status"] == "failed" and lost["failure_kind"] == "lost"
        # Neither was this server's child: it still clears what each left behind.
        wait_for(lambda: not run_leftovers(var), 10)
    finally:
        server.kill(signal.SIGTERM)


def test_a_run_that_ends_while_no_server_runs_leaves_nothing_behind(
    tmp_path: Path, fake_env
) -> None:
    """The run finishes on its own between the server's death and its restart: no server
    watched its end, so the restarted one clears what its session left."""
    var = tmp_path / "var"
    env = {"RLCS_RUNNER_MODULE": FAKE, "FAKE_RUNNER_STEP_S": "0.1"}
    server = LiveServer(var, **env).start()
    try:
        httpx.post(f"{server.url}/environments/arithmetic/select")
        run_id = httpx.post(f"{server.url}/runs", json={"total_steps": 8}).json()["run_id"]
        pid = wait_for(lambda: httpx.get(f"{server.url}/runs/{run_id}").json()["pid"])
        server.kill(signal.SIGKILL)
        engine = make_engine(f"sqlite:///{var / 'rlcs.db'}")

        def ended() -> bool:
            with read_session(engine) as session:
                run = session.get(Run, run_id)
                return run is not None and run.status == "succeeded" and not pid_alive(pid)

        wait_for(ended, 30)
        assert run_leftovers(var)  # its grandchild outlived it: nobody cleared the session
        server = LiveServer(var, **env).start()
        wait_for(lambda: not run_leftovers(var), 10)
    finally:
        server.kill(signal.SIGTERM)


def test_adopted_run_that_dies_is_settled(tmp_path: Path, fake_env) -> None:
    var = tmp_path / "var"
    env = {"RLCS_RUNNER_MODULE": FAKE, "FAKE_RUNNER_STEP_S": "0.3"}
    server = LiveServer(var, **env).start()
    try:
        httpx.post(f"{server.url}/environments/arithmetic/select")
        run_id = httpx.post(f"{server.url}/runs", json={"total_steps": 100}).json()["run_id"]
        pid = wait_for(lambda: httpx.get(f"{server.url}/runs/{run_id}").json()["pid"])
        wait_for(lambda: httpx.get(f"{server.url}/runs/{run_id}").json()["status"] == "running")
        server.kill(signal.SIGKILL)
        server = LiveServer(var, **env).start()
        assert httpx.get(f"{server.url}/runs/{run_id}").json()["status"] == "running"
        os.kill(pid, signal.SIGKILL)
        run = wait_for(
            lambda: (r := httpx.get(f"{server.url}/runs/{run_id}").json())["status"] in FINAL and r,
            10,
        )
        assert run["status"] == "failed" and run["failure_kind"] == "lost"
        wait_for(lambda: not run_leftovers(var), 10)
    finally:
        server.kill(signal.SIGTERM)


def test_fifty_concurrent_starts_with_limit_two(tmp_path: Path, fake_env) -> None:
    var = tmp_path / "var"
    env = {
        "RLCS_RUNNER_MODULE": FAKE,
        "FAKE_RUNNER_STEP_S": "0.02",
        "RLCS_MAX_CONCURRENT_RUNS": "2",
    }
    with LiveServer(var, **env) as server:
        httpx.post(f"{server.url}/environments/arithmetic/select")
        engine = make_engine(f"sqlite:///{var / 'rlcs.db'}")
        most = {"active": 0}
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                with read_session(engine) as session:
                    rows = session.exec(Run.__table__.select()).all()  # type: ignore[attr-defined]
                active = sum(1 for row in rows if row.status in {s.value for s in ACTIVE})
                most["active"] = max(most["active"], active)
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        with httpx.Client(base_url=server.url, timeout=30) as http, ThreadPoolExecutor(50) as ex:
            answers = list(ex.map(lambda _: http.post("/runs", json={"total_steps": 3}), range(50)))
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers][:3]
        ids = {a.json()["run_id"] for a in answers}
        assert len(ids) == 50
        runs = wait_for(
            lambda: (
                (rs := httpx.get(f"{server.url}/runs", params={"limit": 1000}).json())
                and all(r["status"] in FINAL for r in rs)
                and rs
            ),
            120,
        )
        done.set()
        watcher.join()
        assert {r["run_id"] for r in runs} == ids
        assert all(r["status"] == "succeeded" for r in runs), [r["status"] for r in runs]
        assert most["active"] == 2
        logs = (var / "server.log").read_text()
        assert "database is locked" not in logs
        for run_id in ids:
            assert "database is locked" not in (var / "runs" / run_id / "train.log").read_text()
