"""One engine per machine: runs on the shared engine host against runs that each hold their own
copy of the engine (`engine: private`, the former default), through a live server, side by side
in one run. SmolLM2-135M, a short `repeat_word` run (4 steps, group 4, batch 2, 16 tokens).

- Memory: the peak, summed over every process the server started (runners, the engine host),
  sampled every 0.1 s, for one run alone and for 4 runs at once.
- Wall time: the 4 runs at once, against the same 4 one after another (private).
- Step time: a run alone through the host against one alone in its own process (the median
  `time/step_s` of its steps).

Run from the repo root (about 10 minutes on 2 CPU cores):
    .venv/bin/python -m benchmarks.engine_host [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from core import engine_host
from core.model_names import SMOLLM2, smollm2_is_converted
from tests.support.helpers import finish_run, start_run
from tests.support.live_server import LiveServer

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RUN = {
    "environment": "repeat_word",
    "model_name": SMOLLM2,
    "total_steps": 4,
    "group_size": 4,
    "batch_size": 2,
    "max_token_length": 16,
    "lora_rank": 8,
    "use_wandb": False,
    "steps_per_eval": 0,
    "save_every": 0,
}


class PeakMemory:
    """The summed memory of a server's processes and its engine host, at its peak: resident
    (RSS: pages shared between processes, torch's libraries and the mapped weights, counted in
    each) and proportional (PSS: a shared page split between the processes that map it)."""

    def __init__(self, server: LiveServer) -> None:
        self._server = server
        self.peak = 0
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        assert self._server.proc is not None
        root = psutil.Process(self._server.proc.pid)
        while not self._stop.wait(0.1):
            processes = {p.pid: p for p in root.children(recursive=True)}
            record = engine_host.read_record(self._server.var_dir)
            if record is not None and psutil.pid_exists(record.pid):
                processes.setdefault(record.pid, psutil.Process(record.pid))
            rss = pss = 0
            for process in processes.values():
                try:
                    info = process.memory_full_info()
                except psutil.Error:
                    continue
                rss, pss = rss + info.rss, pss + info.pss
            self.peak = max(self.peak, rss)
            self.peak_pss = max(self.peak_pss, pss)


def runs_at_once(api: httpx.Client, count: int, engine: str) -> float:
    """`count` runs started together; seconds until the last ends."""
    started = time.perf_counter()
    ids = [start_run(api, **RUN, seed=i, engine=engine) for i in range(count)]
    for run_id in ids:
        assert finish_run(api, run_id, timeout=1800)["status"] == "succeeded", run_id
    return time.perf_counter() - started


def step_times(api: httpx.Client, engine: str) -> list[float]:
    run_id = start_run(api, **{**RUN, "total_steps": 6}, engine=engine)
    assert finish_run(api, run_id, timeout=1800)["status"] == "succeeded"
    rows = api.get(f"/runs/{run_id}/history").json()["rows"]
    return [row["time/step_s"] for row in rows if "time/step_s" in row][1:]  # the first loads


@dataclass(frozen=True)
class Measured:
    rss_gb: float
    pss_gb: float
    seconds: float


def measure(models_dir: Path, engine: str, count: int) -> Measured:
    """`count` runs at once on a fresh server (and a fresh host): peak memory and wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"RLCS_MODELS_DIR": str(models_dir), "RLCS_MAX_CONCURRENT_RUNS": "8"}
        with LiveServer(Path(tmp) / "var", None, **env) as server:
            api = httpx.Client(base_url=server.url, timeout=60)
            with PeakMemory(server) as memory:
                seconds = runs_at_once(api, count, engine)
            return Measured(memory.peak / 1e9, memory.peak_pss / 1e9, seconds)


def best(values: list[Measured]) -> Measured:
    return Measured(
        min(m.rss_gb for m in values), min(m.pss_gb for m in values), min(m.seconds for m in values)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--models-dir", type=Path, default=PROJECT_ROOT / "var" / "models")
    args = parser.parse_args()
    os.environ["TINKER_TELEMETRY"] = "0"
    models_dir = args.models_dir.resolve()
    if not smollm2_is_converted(models_dir):
        raise SystemExit(f"SmolLM2 is not converted in {models_dir}: run make install first")
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; SmolLM2, "
        f"repeat_word, 4 steps x group 4 x batch 2 x 16 tokens; best of {args.rounds}"
    )
    results: dict[tuple[str, int], list[Measured]] = {}
    for _ in range(args.rounds):
        for engine in ("private", "shared"):
            for count in (1, 4):
                results.setdefault((engine, count), []).append(measure(models_dir, engine, count))
                print(f"{engine} x{count}: {results[(engine, count)][-1]}", flush=True)
    table = {key: best(values) for key, values in results.items()}
    print("\n| engine | runs | peak RSS GB | x alone | peak PSS GB | x alone | wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (engine, count), m in table.items():
        alone = table[(engine, 1)]
        print(
            f"| {engine} | {count} | {m.rss_gb:.2f} | {m.rss_gb / alone.rss_gb:.2f}x "
            f"| {m.pss_gb:.2f} | {m.pss_gb / alone.pss_gb:.2f}x | {m.seconds:.1f} |"
        )
    together = table[("shared", 4)].seconds
    apart, one = table[("private", 4)].seconds, table[("private", 1)].seconds
    print(
        f"4 at once on the host: {together / apart:.2f}x the time of 4 at once in their own "
        f"processes; against 4 one after another: {together / (4 * one):.2f}x on the host, "
        f"{apart / (4 * one):.2f}x in their own processes"
    )
    with tempfile.TemporaryDirectory() as tmp:
        env = {"RLCS_MODELS_DIR": str(models_dir)}
        with LiveServer(Path(tmp) / "var", None, **env) as server:
            api = httpx.Client(base_url=server.url, timeout=60)
            shared = statistics.median(step_times(api, "shared"))
            private = statistics.median(step_times(api, "private"))
    print(
        f"a run's step alone: {shared:.2f} s through the host, {private:.2f} s in its own "
        f"process: {shared / private:.2f}x (goal at most 1.15x)"
    )


if __name__ == "__main__":
    main()
