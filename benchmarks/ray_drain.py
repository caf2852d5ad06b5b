"""Drain a queue of runs through the local launcher and through Ray, side by side: the real
server on PostgreSQL, `--runs` runs queued at once, each a stand-in runner that records
three steps (tests/support/fake_runners/runner.py), at most `--concurrent` at a time. Prints the
wall time to drain each queue, runs per second, the queue-to-running latency, and Ray's
cost as a ratio against the local launcher.
Run from the repo root: .venv/bin/python -m benchmarks.ray_drain [--runs 200]"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx

from core.settings import PROJECT_ROOT
from tests.support.helpers import end_run_leftovers, wait_for
from tests.support.live_server import LiveServer
from tests.support.postgres import PostgresServer
from tests.support.ray_head import RayHead, missing_reason

FINISHED = {"succeeded", "failed", "stopped"}


def drain(server: LiveServer, runs: int) -> dict[str, float]:
    body = {"environment": "arithmetic", "total_steps": 3, "num_cpus": 0.25}
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool, httpx.Client(base_url=server.url, timeout=60) as client:
        ids = list(
            pool.map(lambda _: client.post("/runs", json=body).json()["run_id"], range(runs))
        )

        def all_done() -> list[dict] | None:
            rows = client.get("/runs", params={"limit": runs + 10}).json()
            mine = [r for r in rows if r["run_id"] in set(ids)]
            done = [r for r in mine if r["status"] in FINISHED]
            return mine if len(done) == runs else None

        rows = wait_for(all_done, timeout=3600, every=1.0)
    wall = time.perf_counter() - started
    waits = [
        (_at(r["started_at"]) - _at(r["created_at"])).total_seconds()
        for r in rows
        if r["started_at"]
    ]
    failed = [r for r in rows if r["status"] != "succeeded"]
    return {
        "wall_s": wall,
        "runs_per_s": runs / wall,
        "succeeded": runs - len(failed),
        "queue_to_running_median_s": statistics.median(waits) if waits else float("nan"),
    }


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=8)
    args = parser.parse_args()
    if (why := missing_reason()) is not None:
        raise SystemExit(why)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="ray-drain-") as tmp, PostgresServer() as pg:
        # The stand-in runner lives in tests/, which is not installed: the jobs find it on
        # PYTHONPATH (a real cluster runs the installed runners.train.loop).
        head = RayHead(extra_env={"PYTHONPATH": str(PROJECT_ROOT)}).start()
        try:
            for launcher in ("local", "ray"):
                var = Path(tmp) / launcher / "var"
                env = {
                    "RLCS_LAUNCHER": launcher,
                    "RLCS_RAY_ADDRESS": head.address,
                    "RLCS_DATABASE_URL": pg.new_database(),
                    "RLCS_RUNNER_MODULE": "tests.support.fake_runners.runner",
                    "RLCS_MAX_CONCURRENT_RUNS": str(args.concurrent),
                    "RLCS_SUPERVISOR_INTERVAL_S": "0.5",
                }
                with LiveServer(var, **env) as server:
                    results[launcher] = drain(server, args.runs)
                end_run_leftovers(var)  # each stand-in leaves a `sleep` behind on purpose
        finally:
            head.stop()
    print(f"{args.runs} runs of 3 steps, {args.concurrent} at a time, PostgreSQL, 2 CPUs")
    print(f"{'launcher':<8} {'wall s':>8} {'runs/s':>8} {'queued->running s':>18} {'ok':>5}")
    for launcher, r in results.items():
        print(
            f"{launcher:<8} {r['wall_s']:>8.1f} {r['runs_per_s']:>8.2f} "
            f"{r['queue_to_running_median_s']:>18.2f} {r['succeeded']:>5.0f}"
        )
    ratio = results["ray"]["wall_s"] / results["local"]["wall_s"]
    print(f"ray / local wall time: {ratio:.2f}x")


if __name__ == "__main__":
    main()
