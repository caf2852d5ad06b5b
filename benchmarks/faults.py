"""Fault injection on the real server: kill -9 with run starts in flight, a database locked by
another writer, a server killed while it answers inference, and schemathesis over the whole
API. Prints faults injected, runs affected, lost, stuck, duplicated, and server errors.
Run from the repo root: .venv/bin/python -m benchmarks.faults [--rounds 5] [--examples 25]"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from core.procs import process_start_time, same_process_alive
from core.settings import PROJECT_ROOT
from tests.support.helpers import end_run_leftovers, fake_runner_starts, processes_with, wait_for
from tests.support.live_server import LiveServer

FAKE = {"RLCS_RUNNER_MODULE": "tests.support.fake_runners.runner", "FAKE_RUNNER_STEP_S": "0.05"}
FINISHED = {"succeeded", "failed", "stopped"}
STARTS_IN_FLIGHT = 20


@dataclass
class Outcome:
    fault: str
    injected: int = 0
    runs_affected: int = 0
    lost: int = 0  # answered with an id, then gone
    stuck: int = 0  # never reached an end
    duplicates: int = 0  # a run whose runner started twice
    server_errors: int = 0  # 5xx other than a documented 503
    notes: list[str] = field(default_factory=list)


def kill_during_starts(rounds: int, seed: int = 0) -> Outcome:
    """kill -9 of the server while 20 POST /runs are in flight; restart; every run answered
    with an id must exist and end, none may stay in starting, none may run twice."""
    out = Outcome("server kill -9, 20 POST /runs in flight")
    rng = random.Random(seed)
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="rlcs-faults-") as tmp:
            var = Path(tmp) / "var"
            server = LiveServer(var, **FAKE).start()
            try:
                httpx.post(f"{server.url}/environments/arithmetic/select", timeout=10)
                answered = fire_and_kill(server, rng.randint(1, STARTS_IN_FLIGHT - 5))
                out.injected += 1
                server = LiveServer(var, **FAKE).start()
                runs = settle(server.url, timeout_s=60)
            finally:
                server.kill(signal.SIGTERM)
                end_run_leftovers(var)
            out.runs_affected += len(runs)
            out.lost += len(set(answered) - set(runs))
            out.stuck += sum(1 for r in runs.values() if r["status"] not in FINISHED)
            out.duplicates += sum(1 for r in runs if fake_runner_starts(var / "runs" / r) > 1)
            statuses = sorted({r["status"] + "/" + str(r["failure_kind"]) for r in runs.values()})
            out.notes.append(f"{len(answered)} answered, {len(runs)} rows: {', '.join(statuses)}")
    return out


def fire_and_kill(server: LiveServer, after: int) -> list[str]:
    """20 concurrent POST /runs; SIGKILL the server once `after` have been answered (the rest
    are in flight then); the ids answered."""
    answered: list[str] = []
    enough = threading.Event()

    def start(_: int) -> None:
        try:
            resp = httpx.post(f"{server.url}/runs", json={"total_steps": 5}, timeout=30)
        except httpx.HTTPError:
            return  # the server died under this request: no id was promised
        if resp.status_code == 200:
            answered.append(resp.json()["run_id"])
            if len(answered) >= after:
                enough.set()

    with ThreadPoolExecutor(STARTS_IN_FLIGHT) as pool:
        futures = [pool.submit(start, i) for i in range(STARTS_IN_FLIGHT)]
        enough.wait(30)
        server.kill(signal.SIGKILL)
        for future in futures:
            future.result()
    return answered


def settle(
    url: str, timeout_s: float, meanwhile: Callable[[], object] = lambda: None
) -> dict[str, dict[str, Any]]:
    """Every run once all have ended, or as they are when `timeout_s` runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        meanwhile()
        runs = {r["run_id"]: r for r in httpx.get(f"{url}/runs", timeout=10).json()}
        if all(r["status"] in FINISHED for r in runs.values()) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def kill_runners(seeds: int = 10, total: int = 6) -> Outcome:
    """kill -9 of runners paused at random points of their lives (sampling, training, in the
    middle of a checkpoint write); each must end failed with a reason, and resume from its last
    complete checkpoint must succeed. Uses the checkpointing fake runner (real checkpoint code)."""
    out = Outcome(f"runner kill -9 at random points ({seeds} seeds), then resume")
    rng = random.Random(0)
    points = {}
    for seed in range(seeds):
        step = rng.randint(2, total - 1)
        phase = ("sampling", "training", "checkpoint")[seed % 3]
        points[str(seed)] = (
            f"checkpoint:{step}:{rng.randint(0, 4)}"
            if phase == "checkpoint"
            else (f"{phase}:{step}")
        )
    env = {
        "RLCS_RUNNER_MODULE": "tests.support.fake_runners.checkpointing",
        "RLCS_MAX_CONCURRENT_RUNS": str(seeds),
        "FAKE_PAUSE_AT": json.dumps(points),
    }
    body = {"model_name": "tiny-random", "use_wandb": False, "total_steps": total}
    # A runner that has recorded its end may still be exiting when the server stops.
    with tempfile.TemporaryDirectory(prefix="rlcs-faults-", ignore_cleanup_errors=True) as tmp:
        var = Path(tmp) / "var"
        with (
            LiveServer(var, **env) as server,
            httpx.Client(base_url=server.url, timeout=30) as http,
        ):
            http.post("/environments/arithmetic/select")
            runs = [
                http.post("/runs", json={**body, "seed": s}).json()["run_id"] for s in range(seeds)
            ]
            for run_id in runs:
                wait_for((var / "runs" / run_id / "paused").exists, 60)
                os.kill(http.get(f"/runs/{run_id}").json()["pid"], signal.SIGKILL)
                out.injected += 1
            ended = settle(server.url, 30)
            out.runs_affected = len(ended)
            out.stuck += sum(1 for r in ended.values() if r["status"] not in FINISHED)
            reasons = sum(
                1 for r in ended.values() if r["status"] == "failed" and r["failure_kind"]
            )
            for run_id in runs:
                (var / "runs" / run_id / "paused").unlink(missing_ok=True)
                http.post(f"/runs/{run_id}/resume", json={})

            def release() -> None:  # a resumed attempt reaches its pause point again: go on
                for paused in (var / "runs").glob("*/paused"):
                    paused.unlink(missing_ok=True)

            done = settle(server.url, 60, release)
            out.lost = len(set(runs) - set(done))
            out.stuck += sum(1 for r in done.values() if r["status"] not in FINISHED)
            resumed = sum(1 for r in done.values() if r["status"] == "succeeded")
            out.notes.append(
                f"{reasons}/{seeds} ended failed with a reason; {resumed}/{seeds} resumed to "
                "success from their last complete checkpoint"
            )
            out.stuck += seeds - resumed  # a run that cannot be resumed is stuck for its user
    return out


def locked_database(seconds: float = 5.0) -> Outcome:
    """Another writer holds the SQLite write lock for `seconds` while requests flow."""
    out = Outcome(f"database locked by another writer for {seconds:g} s")
    with tempfile.TemporaryDirectory(prefix="rlcs-faults-") as tmp:
        var = Path(tmp) / "var"
        env = {**FAKE, "RLCS_DB_BUSY_TIMEOUT_S": "2"}
        with (
            LiveServer(var, **env) as server,
            httpx.Client(base_url=server.url, timeout=30) as http,
        ):
            http.post("/environments/arithmetic/select")
            conn = sqlite3.connect(var / "rlcs.db", isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            out.injected = 1
            codes: list[int] = []
            ids: list[str] = []
            ended = time.monotonic() + seconds
            while time.monotonic() < ended:
                for method, path, body in (
                    ("GET", "/runs", None),
                    ("POST", "/runs", {"total_steps": 2}),
                    ("POST", "/config", {"field": "group_size", "value": 8}),
                ):
                    resp = http.request(method, path, json=body)
                    codes.append(resp.status_code)
                    if path == "/runs" and method == "POST" and resp.status_code == 200:
                        ids.append(resp.json()["run_id"])
            conn.execute("ROLLBACK")
            conn.close()
            ids.append(http.post("/runs", json={"total_steps": 2}).json()["run_id"])
            runs = settle(server.url, 30)
            out.runs_affected = len(runs)
            out.lost = len(set(ids) - set(runs))
            out.stuck = sum(1 for r in runs.values() if r["status"] not in FINISHED)
            out.server_errors = sum(1 for c in codes if c >= 500 and c != 503)
            waited = sum(1 for c in codes if c == 503)
            out.notes.append(f"{len(codes)} requests: {waited} answered 503 + Retry-After")
        end_run_leftovers(var)
    return out


def server_dies_during_inference(models_dir: Path) -> Outcome:
    """SIGKILL / SIGTERM of a server decoding a long SmolLM2 answer: no worker after 5 s."""
    out = Outcome("server killed during inference")
    for sig in (signal.SIGKILL, signal.SIGTERM):
        with tempfile.TemporaryDirectory(prefix="rlcs-faults-") as tmp:
            env = {"RLCS_INFERENCE_WARMUP": "0", "RLCS_MODELS_DIR": str(models_dir)}
            server = LiveServer(Path(tmp) / "var", **env).start(timeout=60)
            url = f"{server.url}/test/inference"
            httpx.post(f"{server.url}/environments/repeat_word/select", timeout=10)
            httpx.post(url, json={"prompts": ["Hi"], "max_tokens": 1}, timeout=600)
            assert server.proc is not None
            worker = processes_with("runners.infer", parent=server.proc.pid)[0]
            start = process_start_time(worker)
            long = {"prompts": ["Tell me a long story."], "max_tokens": 4000}
            threading.Thread(target=_post_quietly, args=(url, long), daemon=True).start()
            time.sleep(2.0)  # decoding by now (its first tokens come within a second)
            server.proc.send_signal(sig)
            server.proc.wait(timeout=30)
            out.injected += 1
            deadline = time.monotonic() + 5
            while same_process_alive(worker, start) and time.monotonic() < deadline:
                time.sleep(0.1)
            if same_process_alive(worker, start):
                out.stuck += 1
                os.kill(worker, signal.SIGKILL)
            out.notes.append(f"{sig.name}: worker gone within 5 s: {out.stuck == 0}")
    return out


def _post_quietly(url: str, body: dict[str, Any]) -> None:
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(url, json=body, timeout=120)


def fuzz(examples: int) -> Outcome:
    """schemathesis over every operation against a server whose runs crash at once."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    out = Outcome("schemathesis over the whole API")
    env = {**FAKE, "FAKE_RUNNER_MODE": "crash", "RLCS_MAX_CONCURRENT_RUNS": "1"}
    with tempfile.TemporaryDirectory(prefix="rlcs-faults-") as tmp:
        var = Path(tmp) / "var"
        with LiveServer(var, **env) as server:
            schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
            calls: list[int] = []
            for result in schema.get_all_operations():
                operation = result.ok()

                @given(case=operation.as_strategy())
                @settings(
                    max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck)
                )
                def call(case: Any) -> None:
                    calls.append(case.call(base_url=server.url, timeout=20).status_code)

                call()
        end_run_leftovers(var)
    out.injected = len(calls)
    out.server_errors = sum(1 for c in calls if c >= 500)
    out.notes.append(f"{len(calls)} generated requests, statuses {sorted(set(calls))}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="kill -9 rounds")
    parser.add_argument("--examples", type=int, default=25, help="schemathesis per operation")
    parser.add_argument("--no-inference", action="store_true", help="skip the SmolLM2 fault")
    args = parser.parse_args()
    outcomes = [kill_during_starts(args.rounds), kill_runners(), locked_database()]
    if not args.no_inference:
        outcomes.append(server_dies_during_inference(PROJECT_ROOT / "var" / "models"))
    outcomes.append(fuzz(args.examples))
    print(
        "| fault | injected | runs affected | lost | stuck | duplicates | 5xx |\n"
        "|---|---:|---:|---:|---:|---:|---:|"
    )
    for o in outcomes:
        print(
            f"| {o.fault} | {o.injected} | {o.runs_affected} | {o.lost} | {o.stuck} | "
            f"{o.duplicates} | {o.server_errors} |"
        )
    for o in outcomes:
        for note in o.notes:
            print(f"- {o.fault}: {note}")
    bad = sum(o.lost + o.stuck + o.duplicates + o.server_errors for o in outcomes)
    print(f"invariants {'hold' if bad == 0 else f'BROKEN ({bad})'}")


if __name__ == "__main__":
    main()
