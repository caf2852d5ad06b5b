"""Latency of POST /test/inference (cold worker against warm) and of GET /runs/{id} when W&B
answers at once against in 5 s, on the real server (`python -m server`) and a W&B stand-in.
Run from the repo root: .venv/bin/python -m benchmarks.inference [--model HF_ID] [--warm 10]"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from core import lifecycle, schema
from core.db import make_engine, write_session
from core.models import Run, RunStatus
from core.settings import PROJECT_ROOT, Settings
from tests.support.live_server import LiveServer
from tests.support.standins.wandb_standin import WandbStandin

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPTS = ["What is 12 + 7?", "What is 9 * 8?", "What is 30 - 45?", "What is 6 * 7?"]

# The W&B side: a 40-character key (like a real one) that only the stand-in knows.
WANDB_KEY = "benchkey" + "0123456789abcdef" * 2
ENTITY, PROJECT, WANDB_RUN = "team-rl", "rl-training", "rlcs-bench01"
WANDB_SUMMARY = {
    "reward/mean": 0.625,
    "train/loss": 0.183,
    "env/percent_correct": 0.55,
    "eval/percent_correct": 0.5,
    "_step": 9,
}
RUN_WANDB, RUN_LOCAL = "r-0000beef", "r-0000cafe"
CACHE_S = 1.0  # RLCS_WANDB_CACHE_S: short, so a cache expiry is a second's wait
# A 5-s answer must be an answer, not a timeout that sends the reader into backoff (the default
# 3 s would), so that every slow sample below is a fetch W&B really answers.
TIMEOUT_S = 10.0
SLOW_S = 5.0


# Processes ---------------------------------------------------------------------------------


def _ppid_and_start(pid: int) -> tuple[int, str] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return int(fields[1]), fields[19]


def descendants(root: int) -> dict[int, str]:
    """Every process below `root`, with its start time (so a reused pid is never signalled)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (info := _ppid_and_start(int(entry.name))) is not None:
            table[int(entry.name)] = info
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, start) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


class Server:
    """The real server in a temporary var dir; on exit, it and everything it started are gone
    (the inference worker runs in its own session, so a group signal would miss it)."""

    def __init__(self, var_dir: Path, **env: str) -> None:
        self.live = LiveServer(var_dir, **env)
        self.url = self.live.url
        self.leftovers: list[int] = []

    def __enter__(self) -> Server:
        try:
            self.live.start(timeout=60)
        except BaseException:
            self.__exit__()  # LiveServer leaves a server that never answered running
            raise
        return self

    def __exit__(self, *_: object) -> None:
        proc = self.live.proc
        children = descendants(proc.pid) if proc is not None and proc.poll() is None else {}
        self.live.kill(signal.SIGTERM)
        alive = children
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            alive = {p: s for p, s in children.items() if (_ppid_and_start(p) or (0, ""))[1] == s}
            if not alive:
                return
            time.sleep(0.1)
        for pid in alive:
            self.leftovers.append(pid)
            with contextlib.suppress(ProcessLookupError):  # it may have ended just now
                os.kill(pid, signal.SIGKILL)


# Timing ------------------------------------------------------------------------------------


@dataclass
class Samples:
    seconds: list[float] = field(default_factory=list)
    notes: set[str] = field(default_factory=set)

    def add(self, started: float, note: str = "") -> None:
        self.seconds.append(time.perf_counter() - started)
        if note:
            self.notes.add(note)

    @property
    def p50(self) -> float:
        return statistics.median(self.seconds)

    @property
    def max(self) -> float:
        return max(self.seconds)


def timed_get(http: httpx.Client, path: str, into: Samples) -> dict[str, Any]:
    started = time.perf_counter()
    response = http.get(path)
    response.raise_for_status()
    body = response.json()
    into.add(started, body.get("metrics_source", ""))
    return body


def row(label: str, s: Samples, base: float | None, extra: str = "") -> str:
    ratio = f"{s.p50 / base:>7.2f}x" if base else f"{'':>8}"
    return (
        f"  {label:<48} {len(s.seconds):>3} {s.p50 * 1e3:>9.1f} {s.max * 1e3:>9.1f} {ratio}  "
        f"{extra}"
    )


# POST /test/inference ----------------------------------------------------------------------


def bench_inference(tmp: Path, model: str, warm: int, max_tokens: int, models_dir: Path) -> None:
    slug = model.replace("/", "--")
    with Server(tmp / f"infer-{slug}", RLCS_MODELS_DIR=str(models_dir)) as server:
        http = httpx.Client(base_url=server.url, timeout=300)
        health = Samples()
        for _ in range(10):
            started = time.perf_counter()
            http.get("/health").raise_for_status()
            health.add(started)
        put = http.put("/environments/arithmetic/config", json={"values": {"model_name": model}})
        put.raise_for_status()
        body = {
            "prompts": PROMPTS,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "environment": "arithmetic",
            "seed": 0,
        }
        cold, warm_samples = Samples(), Samples()
        worker_s: list[float] = []
        for n in range(1 + warm):
            started = time.perf_counter()
            response = http.post("/test/inference", json=body)
            if response.status_code != 200:
                raise RuntimeError(f"POST /test/inference: {response.status_code} {response.text}")
            (cold if n == 0 else warm_samples).add(started)
            answer = response.json()
            worker_s.append(answer["summary"]["latency_s"])
            tokens = answer["summary"]["tokens"]
        http.close()
    print(
        f"\nPOST /test/inference, model {model}: {len(PROMPTS)} arithmetic prompts, "
        f"max_tokens {max_tokens} ({tokens} tokens generated in the last call), temperature 1"
    )
    print(f"  {'call':<48} {'n':>3} {'p50 ms':>9} {'max ms':>9} {'vs warm':>8}")
    print(row("GET /health (HTTP floor)", health, warm_samples.p50))
    print(
        row(
            "first call (cold: worker starts, loads model)",
            cold,
            warm_samples.p50,
            f"worker's own time {worker_s[0] * 1e3:.0f} ms",
        )
    )
    print(
        row(
            "later calls (warm worker)",
            warm_samples,
            warm_samples.p50,
            f"worker's own time p50 {statistics.median(worker_s[1:]) * 1e3:.0f} ms",
        )
    )
    print(f"  cold / warm: {cold.p50 / warm_samples.p50:.1f}x")
    if server.leftovers:
        print(f"  (killed leftover processes after shutdown: {server.leftovers})")


# GET /runs/{id} with W&B -------------------------------------------------------------------


def seed_runs(var_dir: Path) -> None:
    """Two running runs as a runner would have left them (one local metrics row each), one
    with a W&B path; inserted before the server starts, as in api_load.py."""
    settings = Settings(var_dir=var_dir)
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url)
    schema.upgrade(engine)
    for run_id, path in ((RUN_WANDB, f"{ENTITY}/{PROJECT}/{WANDB_RUN}"), (RUN_LOCAL, None)):
        with write_session(engine) as session:
            session.add(
                Run(
                    id=run_id,
                    environment="arithmetic",
                    status=RunStatus.running,
                    config_json="{}",
                    config_hash="h",
                    total_steps=20,
                    run_dir=str(settings.runs_dir / run_id),
                    wandb_path=path,
                    wandb_url=f"https://wandb.ai/{path}" if path else None,
                )
            )
        lifecycle.record_step(engine, run_id, 3, {"reward/mean": 0.1, "train/loss": 2.0})
    engine.dispose()


def wait_until(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def in_flight(standin: WandbStandin) -> int:
    return sum(1 for r in list(standin.requests) if r.status is None)


def bench_wandb(tmp: Path, cycles: int, cached_per_cycle: int) -> None:
    var_dir = tmp / "wandb"
    seed_runs(var_dir)
    wb_path, local_path = f"/runs/{RUN_WANDB}", f"/runs/{RUN_LOCAL}"
    first, local, cached, fresh = Samples(), Samples(), Samples(), Samples()
    slow_first, slow_second = Samples(), Samples()
    with WandbStandin(expected_api_key=WANDB_KEY) as standin:
        standin.add_run(ENTITY, PROJECT, WANDB_RUN, WANDB_SUMMARY, [WANDB_SUMMARY])
        env = {
            "WANDB_API_KEY": WANDB_KEY,
            "WANDB_BASE_URL": standin.url,
            "RLCS_WANDB_CACHE_S": str(CACHE_S),
            "RLCS_WANDB_TIMEOUT_S": str(TIMEOUT_S),
        }
        with (
            Server(var_dir, **env) as server,
            httpx.Client(base_url=server.url, timeout=60) as http,
        ):
            # Straight after start-up: the server is still importing wandb and logging in.
            timed_get(http, wb_path, first)
            if not wait_until(lambda: http.get(wb_path).json()["metrics_source"] == "wandb", 60):
                raise RuntimeError("GET /runs/{id} never answered from W&B")
            for _ in range(20):
                timed_get(http, local_path, local)
            requests_per_fetch: list[int] = []
            cached_requests = 0
            for _ in range(cycles):
                # delay 0: the first call after the cache expired fetches; the next are cached.
                time.sleep(CACHE_S + 0.2)
                before = standin.request_count
                assert timed_get(http, wb_path, fresh)["metrics_source"] == "wandb"
                requests_per_fetch.append(standin.request_count - before)
                before = standin.request_count
                for _ in range(cached_per_cycle):
                    timed_get(http, wb_path, cached)
                cached_requests += standin.request_count - before
            standin.delay_s = SLOW_S
            for _ in range(cycles):
                time.sleep(CACHE_S + 0.2)
                body = timed_get(http, wb_path, slow_first)
                slow_first.notes.add(str(body["metrics_note"]))
                # A second caller while that fetch is still waiting on W&B.
                timed_get(http, wb_path, slow_second)
                if not wait_until(lambda: in_flight(standin) == 0, SLOW_S * 3):
                    raise RuntimeError("the stand-in never answered")
            standin.delay_s = 0.0
    print(
        f"\nGET /runs/{{id}} of a running run with a W&B path, W&B = loopback stand-in; "
        f"RLCS_WANDB_CACHE_S={CACHE_S:g}, RLCS_WANDB_TIMEOUT_S={TIMEOUT_S:g}, reader wait_s 1 s"
    )
    print(f"  {'call':<48} {'n':>3} {'p50 ms':>9} {'max ms':>9} {'vs fresh':>8}  metrics_source")
    base = fresh.p50

    def sources(s: Samples) -> str:
        return ", ".join(sorted(n for n in s.notes if n in ("wandb", "local")))

    print(row("first call after start-up (W&B at once)", first, base, sources(first)))
    print(row("run without W&B path (database only)", local, base, sources(local)))
    print(row("W&B at once, cached (< 1 s old)", cached, base, sources(cached)))
    print(row("W&B at once, first call after cache expired", fresh, base, sources(fresh)))
    print(
        row(
            f"W&B in {SLOW_S:g} s, first call after cache expired",
            slow_first,
            base,
            sources(slow_first),
        )
    )
    print(
        row(
            f"W&B in {SLOW_S:g} s, a second call during that fetch",
            slow_second,
            base,
            sources(slow_second),
        )
    )
    notes = sorted(n for n in slow_first.notes if n not in ("wandb", "local"))
    print(
        f"  GraphQL requests per fetch: {sorted(set(requests_per_fetch))}; during cached calls: "
        f"{cached_requests}"
    )
    print(
        f"  slow W&B / fresh: {slow_first.p50 / base:.0f}x; slow answer p50 "
        f"{slow_first.p50:.2f} s against W&B's {SLOW_S:g} s ({slow_first.p50 / SLOW_S:.2f}x)"
    )
    if notes:
        print(f"  note with the slow answers, e.g.: {notes[0]!r}")
    if server.leftovers:
        print(f"  (killed leftover processes after shutdown: {server.leftovers})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help=f"also time this model after tiny-random (repeatable), e.g. {SMOLLM2}",
    )
    parser.add_argument("--warm", type=int, default=10, help="warm inference calls per model")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--models-dir", type=Path, default=PROJECT_ROOT / "var" / "models")
    parser.add_argument("--cycles", type=int, default=5, help="cache expiries timed per delay")
    parser.add_argument("--cached", type=int, default=5, help="cached calls after each expiry")
    parser.add_argument("--skip-inference", action="store_true")
    parser.add_argument("--skip-wandb", action="store_true")
    args = parser.parse_args()
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPU cores, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="rlcs-bench-infer-") as tmp:
        if not args.skip_inference:
            for model in ["tiny-random", *args.model]:
                bench_inference(Path(tmp), model, args.warm, args.max_tokens, args.models_dir)
        if not args.skip_wandb:
            bench_wandb(Path(tmp), args.cycles, args.cached)


if __name__ == "__main__":
    main()
