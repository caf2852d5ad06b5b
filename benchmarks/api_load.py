"""API load (rps, latency of GET /runs/{id} and GET /runs beside GET /health) on a real server
holding 1,000 finished runs, and the supervisor's time per tick with 100 live runs; on SQLite
and, with --databases sqlite,postgresql, on a real PostgreSQL started for the run.
Run from the repo root: .venv/bin/python -m benchmarks.api_load [--requests 2000] [--ticks 50]"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy.engine import Engine
from sqlmodel import Session

from core import schema
from core.db import make_engine
from core.models import Metric, Run, RunStatus
from core.procs import process_start_time
from core.run_folder import hash_config
from core.settings import PROJECT_ROOT, Settings
from environments.base import EnvConfig
from server.launch.launcher import LOCAL_LAUNCHER
from server.launch.supervisor import Supervisor
from tests.support.live_server import free_port, stop_process

CLIENTS = 32
RUNS = 1000
METRICS_PER_RUN = 5
ACTIVE_RUNS = 100
# A real runner module, never started: every run is inserted finished, or adopted as running.
RUNNER_MODULE = "tests.support.fake_runners.runner"


# Database ----------------------------------------------------------------------------------


def seed(
    engine: Engine,
    runs_dir: Path,
    count: int,
    status: RunStatus,
    pids: list[tuple[int, float | None]] | None = None,
    first: int = 0,
) -> list[str]:
    """Insert `count` runs as the runner would have left them, with METRICS_PER_RUN rows each."""
    values = EnvConfig().model_dump(mode="json")
    config_json, config_hash = json.dumps(values, sort_keys=True), hash_config(values)
    now = datetime.now(UTC)
    ids = []
    with Session(engine) as session:
        for n in range(count):
            run_id = f"r-{first + n:08x}"
            created = now - timedelta(minutes=10 * (first + n + 1))
            finished = status in (RunStatus.succeeded, RunStatus.failed, RunStatus.stopped)
            pid, start = pids[n] if pids else (None, None)
            session.add(
                Run(
                    id=run_id,
                    environment="arithmetic",
                    status=status,
                    config_json=config_json,
                    config_hash=config_hash,
                    step=20 if finished else METRICS_PER_RUN,
                    total_steps=20,
                    pid=pid,
                    process_start=start,
                    exit_code=0 if finished else None,
                    run_dir=str(runs_dir / run_id),
                    wandb_path=f"bench/rl-training/{run_id}",
                    created_at=created,
                    started_at=created + timedelta(seconds=2),
                    last_step_at=created + timedelta(minutes=5),
                    finished_at=created + timedelta(minutes=5) if finished else None,
                )
            )
            ids.append(run_id)
        # Rows of the parent table first: the metric rows' foreign key checks them.
        session.flush()
        for run_id in ids:
            for step in range(1, METRICS_PER_RUN + 1):
                metrics = {
                    "reward/mean": step / 10,
                    "train/loss": 1.0 / step,
                    "env/percent_correct": step / 20,
                    "time/step_s": 12.5,
                    "sampler/action_num_tokens": 64.0,
                }
                if step == METRICS_PER_RUN:
                    metrics["eval/percent_correct"] = 0.4
                session.add(Metric(run_id=run_id, step=step, values_json=json.dumps(metrics)))
        session.commit()
    return ids


def fresh_db(var_dir: Path, database_url: str | None = None) -> tuple[Settings, Engine]:
    settings = Settings(
        var_dir=var_dir,
        database_url=database_url,
        runner_module=RUNNER_MODULE,
        max_concurrent_runs=1,
        api_token=None,
        tinker_api_key=None,
        wandb_api_key=None,
    )
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url)
    schema.upgrade(engine)
    return settings, engine


# HTTP load ---------------------------------------------------------------------------------


def start_server(var_dir: Path, database_url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "RLCS_VAR_DIR": str(var_dir),
        "RLCS_DATABASE_URL": database_url,
        "RLCS_HOST": "127.0.0.1",
        "RLCS_PORT": str(port),
        "RLCS_RUNNER_MODULE": RUNNER_MODULE,
        "RLCS_MAX_CONCURRENT_RUNS": "1",
    }
    for key in ("TINKER_API_KEY", "WANDB_API_KEY", "OPENREWARD_API_KEY", "RLCS_API_TOKEN"):
        env.pop(key, None)
    log = (var_dir / "server.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "server"], cwd=PROJECT_ROOT, env=env, stdout=log, stderr=log
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((var_dir / "server.log").read_text()[-2000:])
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    stop_process(proc)
    raise RuntimeError("the server did not answer /health within 30 s")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(
    url: str, server_pid: int, path_for: Callable[[random.Random], str], requests: int
) -> dict[str, float]:
    """`requests` GETs from CLIENTS threads, one keep-alive client each, after a warm-up.

    CPU per request is reported for both sides: on a small machine they share the cores, so
    rps alone mixes the server's cost with the client's.
    """
    per_client = [requests // CLIENTS + (i < requests % CLIENTS) for i in range(CLIENTS)]
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    errors = [0] * CLIENTS
    ready = threading.Barrier(CLIENTS + 1)

    def client(i: int) -> None:
        rng = random.Random(i)
        with httpx.Client(base_url=url, timeout=60) as http:
            for _ in range(5):  # connection up, server-side caches and pools warm
                http.get(path_for(rng))
            ready.wait()
            for _ in range(per_client[i]):
                path = path_for(rng)
                start = time.perf_counter()
                response = http.get(path)
                latencies[i].append(time.perf_counter() - start)
                errors[i] += response.status_code != 200

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    ready.wait()
    start = time.perf_counter()
    server_cpu, client_cpu = cpu_seconds(server_pid), time.process_time()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    server_cpu = cpu_seconds(server_pid) - server_cpu
    client_cpu = time.process_time() - client_cpu
    flat = [x for lat in latencies for x in lat]
    return {
        "rps": len(flat) / wall,
        "server_cpu_ms": server_cpu / len(flat) * 1e3,
        "client_cpu_ms": client_cpu / len(flat) * 1e3,
        "p50_ms": percentile(flat, 50) * 1e3,
        "p99_ms": percentile(flat, 99) * 1e3,
        "errors": sum(errors),
    }


def bench_api(
    tmp: Path, requests: int, database_url: str | None
) -> list[tuple[str, dict[str, float]]]:
    var_dir = tmp / "api"
    settings, engine = fresh_db(var_dir, database_url)
    ids = seed(engine, settings.runs_dir, RUNS, RunStatus.succeeded)
    engine.dispose()
    proc, url = start_server(var_dir, settings.db_url)
    try:
        # Answers are what they should be before anything is timed.
        listed = httpx.get(f"{url}/runs").json()
        assert len(listed) == 100 and listed[0]["run_id"] == ids[0], listed[:1]
        detail = httpx.get(f"{url}/runs/{ids[-1]}").json()
        assert detail["status"] == "succeeded" and detail["metrics"]["reward_mean"] == 0.5, detail
        endpoints: list[tuple[str, Callable[[random.Random], str]]] = [
            ("GET /health (baseline)", lambda rng: "/health"),
            # No database, no file system: the framework's floor on this machine.
            ("GET /docs (static 1 KB page)", lambda rng: "/docs"),
            ("GET /runs/{id} (random of 1,000)", lambda rng: f"/runs/{rng.choice(ids)}"),
            ("GET /runs (newest 100)", lambda rng: "/runs"),
        ]
        return [(name, load(url, proc.pid, path_for, requests)) for name, path_for in endpoints]
    finally:
        stop_process(proc)


# Supervisor --------------------------------------------------------------------------------


def time_ticks(supervisor: Supervisor, ticks: int) -> list[float]:
    for _ in range(3):
        supervisor.tick()
    out = []
    for _ in range(ticks):
        start = time.perf_counter()
        supervisor.tick()
        out.append(time.perf_counter() - start)
    return out


def bench_supervisor(
    tmp: Path, ticks: int, new_database: Callable[[], str | None]
) -> dict[str, list[float]]:
    sleepers: list[subprocess.Popen[bytes]] = []
    try:
        # Each in its own session, as the supervisor spawns runners (pid = process group).
        for _ in range(ACTIVE_RUNS):
            sleepers.append(subprocess.Popen(["sleep", "300"], start_new_session=True))
        pids = [(p.pid, process_start_time(p.pid)) for p in sleepers]
        results = {}
        for label, active in (("0 active", 0), (f"{ACTIVE_RUNS} active", ACTIVE_RUNS)):
            settings, engine = fresh_db(tmp / f"sup{active}", new_database())
            # Both databases hold the same history, so only the active runs differ.
            seed(engine, settings.runs_dir, RUNS, RunStatus.succeeded)
            seed(engine, settings.runs_dir, active, RunStatus.running, pids, first=RUNS)
            supervisor = Supervisor(settings, engine)
            supervisor.reconcile()
            # The local launcher adopts and watches the runs (server/launch/local.py).
            local = supervisor.launchers.get(LOCAL_LAUNCHER)
            assert len(local._watched) == active, "reconcile() did not adopt every run"
            results[label] = time_ticks(supervisor, ticks)
            # Nothing was settled as lost or spawned: the tick only watched.
            assert len(local._watched) == active
            engine.dispose()
        return results
    finally:
        for proc in sleepers:
            proc.kill()
        for proc in sleepers:
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000, help="timed requests per endpoint")
    parser.add_argument("--ticks", type=int, default=50, help="timed supervisor ticks")
    parser.add_argument(
        "--databases", default="sqlite", help="comma-separated: sqlite, postgresql (or both)"
    )
    args = parser.parse_args()
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPU cores (clients and server share them), "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlcs-bench-api-")))
        for database in args.databases.split(","):
            if database == "postgresql":
                from tests.support.postgres import (
                    PostgresServer,  # a real server, started for the run
                )

                postgres = stack.enter_context(PostgresServer())
                new_database: Callable[[], str | None] = postgres.new_database
            elif database == "sqlite":
                new_database = lambda: None  # noqa: E731  (the default file under var_dir)
            else:
                raise SystemExit(f"--databases: unknown {database!r}; use sqlite, postgresql")
            print(f"\n=== {database} ===")
            report(database, tmp / database, args, new_database)


def report(
    database: str, tmp: Path, args: argparse.Namespace, new_database: Callable[[], str | None]
) -> None:
    results = bench_api(tmp, args.requests, new_database())
    print(
        f"{RUNS} finished runs x {METRICS_PER_RUN} metric rows; {CLIENTS} clients (threads, "
        f"one keep-alive httpx.Client each), {args.requests} requests per endpoint"
    )
    print(
        f"  {'endpoint':<34} {'rps':>6} {'vs base':>7} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'srv CPU ms/req':>14} {'client CPU':>10} {'errors':>6}"
    )
    base_rps = results[0][1]["rps"]
    for name, r in results:
        print(
            f"  {name:<34} {r['rps']:>6.0f} {r['rps'] / base_rps:>6.2f}x {r['p50_ms']:>7.1f} "
            f"{r['p99_ms']:>7.1f} {r['server_cpu_ms']:>14.2f} {r['client_cpu_ms']:>10.2f} "
            f"{r['errors']:>6.0f}"
        )
    ticks = bench_supervisor(tmp, args.ticks, new_database)
    print(f"Supervisor.tick() on {database}, in-process, {args.ticks} ticks ({RUNS} finished runs)")
    print(f"  {'active runs (live sleep pids)':<34} {'mean ms':>8} {'p99 ms':>8}  vs base")
    base_mean = statistics.mean(ticks["0 active"])
    for label, samples in ticks.items():
        mean = statistics.mean(samples)
        print(
            f"  {label:<34} {mean * 1e3:>8.2f} {percentile(samples, 99) * 1e3:>8.2f}  "
            f"{mean / base_mean:.1f}x"
        )


if __name__ == "__main__":
    main()
