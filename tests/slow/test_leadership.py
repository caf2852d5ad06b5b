"""Two servers on one database: both serve every route, exactly one supervises the runs, and
when it dies the other takes over within seconds without starting any run twice. PostgreSQL
(an advisory lock) and SQLite (a lock file beside the database)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from tests.support.helpers import fake_runner_starts, pid_alive, run_leftovers, wait_for
from tests.support.live_server import LiveServer

FAKE = {
    "RLCS_RUNNER_MODULE": "tests.support.fake_runners.runner",
    "FAKE_RUNNER_STEP_S": "0.1",
    "RLCS_MAX_CONCURRENT_RUNS": "2",
    "RLCS_LEADER_POLL_S": "0.5",
}
FINISHED = {"succeeded", "failed", "stopped"}


def role(server: LiveServer) -> str:
    return httpx.get(f"{server.url}/health", timeout=10).json()["supervisor"]


def take_over(first: LiveServer, second: LiveServer, runs: int) -> None:
    """Queue runs through both, kill -9 the supervising one mid-way: every run ends, each
    started exactly once, and the other server supervises."""
    assert role(first) == "supervising"
    assert role(second).startswith("standing by: another server")
    ids = []
    for i in range(runs):
        server = (first, second)[i % 2]  # both serve every route
        resp = httpx.post(f"{server.url}/runs", json={"total_steps": 8}, timeout=30)
        assert resp.status_code == 200, resp.text
        ids.append(resp.json()["run_id"])
    # Some run started by the first server, others still queued, then it dies.
    wait_for(lambda: httpx.get(f"{second.url}/runs/{ids[0]}").json()["step"] >= 1, 30)
    first.kill(signal.SIGKILL)
    wait_for(lambda: role(second) == "supervising", 10)

    def all_ended() -> list[dict] | None:
        rows = [httpx.get(f"{second.url}/runs/{rid}", timeout=10).json() for rid in ids]
        return rows if all(r["status"] in FINISHED for r in rows) else None

    rows = wait_for(all_ended, 120, every=0.2)
    assert [r["status"] for r in rows] == ["succeeded"] * runs, rows
    # Their processes end just after recording it; the supervisor then clears their groups.
    wait_for(lambda: not any(pid_alive(r["pid"]) for r in rows), 10)
    wait_for(lambda: not run_leftovers(first.var_dir, second.var_dir), 10)
    for run_id in ids:
        run_dir = next(p for p in (first.var_dir, second.var_dir) if (p / "runs" / run_id).exists())
        assert fake_runner_starts(run_dir / "runs" / run_id) == 1, run_id


def test_two_servers_on_one_postgresql(tmp_path: Path, postgres_url: str) -> None:
    env = {**FAKE, "RLCS_DATABASE_URL": postgres_url}
    first = LiveServer(tmp_path / "a", **env).start()
    second = LiveServer(tmp_path / "b", **env).start()
    try:
        httpx.post(f"{second.url}/environments/arithmetic/select", timeout=10)
        take_over(first, second, runs=6)
    finally:
        for server in (first, second):
            server.kill(signal.SIGTERM)


def test_a_second_server_on_one_sqlite_file_stands_by_and_says_why(tmp_path: Path) -> None:
    var = tmp_path / "var"
    first = LiveServer(var, **FAKE).start()
    second = LiveServer(var, **FAKE).start()  # the same var dir: the same SQLite file
    try:
        httpx.post(f"{second.url}/environments/arithmetic/select", timeout=10)
        assert "need PostgreSQL" in role(second)
        assert str(first.proc.pid) in role(second)  # type: ignore[union-attr]
        take_over(first, second, runs=4)
    finally:
        for server in (first, second):
            server.kill(signal.SIGTERM)
