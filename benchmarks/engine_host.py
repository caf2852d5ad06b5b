"""Engine hosts through a live server, side by side in one run. SmolLM2-135M, a short
`repeat_word` run (4 steps, group 4, batch 2, 16 tokens). Parts:

- `shared` (issue 43): runs on the shared engine host against runs that each hold their own
  copy of the engine (`engine: private`). Memory: the peak, summed over every process the
  server started (runners, the engine hosts), sampled every 0.1 s, for one run alone and for 4
  at once; wall time of the 4 at once against 4 one after another; a run's step alone through
  the host against one in its own process (the median `time/step_s` of its steps).
- `kept` (issue 52): one server kept up, 1 run, then 4 at once, then 1 again: each batch's
  peak (every process of the server, the server included, and its hosts) against the first
  one's, and the host's RSS after each batch, once settled, against before it (what a host
  keeps after its runs end counts against the next; the host warmed up as it started), the
  host as shipped against one on glibc's own malloc thresholds, in turn.
- `hosts` (issue 52): runs on bases X, Y, X (SmolLM2 and a copy of it under another name) at
  once on two engine hosts (RLCS_ENGINE_HOSTS=2, each on one core) against one host: the
  hosts made, where each base loaded, wall time and peak memory.

Run from the repo root (about 10 minutes a part on 2 CPU cores):
    .venv/bin/python -m benchmarks.engine_host [--parts shared,kept,hosts] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from benchmarks.watch import Watch
from core import engine_host
from core.model_names import SMOLLM2, smollm2_converted_dir, smollm2_is_converted
from core.settings import Settings
from tests.support.helpers import finish_run, start_run, wait_for
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


class PeakMemory(Watch):
    """The summed memory of a server's processes and its engine hosts, at its peak (read every
    0.1 s): resident (RSS: pages shared between processes, torch's libraries and the mapped
    weights, counted in each) and proportional (PSS: a shared page split between the processes
    that map it); the server itself counted with `with_server`."""

    def __init__(self, server: LiveServer, with_server: bool = False) -> None:
        super().__init__(0.1)
        assert server.proc is not None
        self._root = psutil.Process(server.proc.pid)
        self._var_dir = server.var_dir
        self._with_server = with_server
        self.peak = 0
        self.peak_pss = 0

    def look(self) -> None:
        root = self._root
        processes = {p.pid: p for p in root.children(recursive=True)}
        if self._with_server:
            processes[root.pid] = root
        for pid in host_pids(self._var_dir):
            processes.setdefault(pid, psutil.Process(pid))
        rss = pss = 0
        for process in processes.values():
            try:
                info = process.memory_full_info()
            except psutil.Error:
                continue
            rss, pss = rss + info.rss, pss + info.pss
        self.peak = max(self.peak, rss)
        self.peak_pss = max(self.peak_pss, pss)


def host_pids(var_dir: Path) -> list[int]:
    """The live engine hosts of `var_dir` on this machine."""
    records = [engine_host.read_record(home) for home in engine_host.recorded(var_dir)]
    return [r.pid for r in records if r is not None and psutil.pid_exists(r.pid)]


def runs_at_once(
    api: httpx.Client, count: int, engine: str, models: list[str] | None = None
) -> float:
    """`count` runs started together (on `models` in turn, else SmolLM2); seconds until the
    last ends."""
    started = time.perf_counter()
    bases = models or [SMOLLM2]
    ids = [
        start_run(api, **{**RUN, "model_name": bases[i % len(bases)]}, seed=i, engine=engine)
        for i in range(count)
    ]
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
    parser.add_argument("--parts", default="shared,kept,hosts")
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
    parts = args.parts.split(",")
    if "shared" in parts:
        shared_against_private(models_dir, args.rounds)
    if "kept" in parts:
        kept_up(models_dir, args.rounds)
    if "hosts" in parts:
        for _ in range(args.rounds):
            two_hosts(models_dir)


def shared_against_private(models_dir: Path, rounds: int) -> None:
    results: dict[tuple[str, int], list[Measured]] = {}
    for _ in range(rounds):
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


@dataclass(frozen=True)
class Batch:
    runs: int
    peak_gb: float  # every process of the server, the server included, and its hosts
    host_before_gb: float
    host_after_gb: float
    seconds: float


def host_rss(var_dir: Path) -> float:
    """The engine hosts' summed RSS, in GB."""
    return sum(psutil.Process(pid).memory_info().rss for pid in host_pids(var_dir)) / 1e9


def settled_rss(var_dir: Path, within: float = 0.01, every_s: float = 1.0) -> float:
    """The hosts' RSS once it stops moving (within 1% a second apart, at most a minute): a
    host warms up as it starts, and lets a client's memory go a moment after the client."""
    last = host_rss(var_dir)
    for _ in range(60):
        time.sleep(every_s)
        now = host_rss(var_dir)
        if abs(now - last) <= within * last:
            return now
        last = now
    return last


# The kept part's arms: the host's environment as shipped, and without its malloc thresholds
# (glibc's own, rising ones).
MALLOC_ARMS = {
    "as shipped": engine_host.HOST_ENVIRONMENT,
    "glibc's own thresholds": {
        k: v for k, v in engine_host.HOST_ENVIRONMENT.items() if not k.startswith("MALLOC_")
    },
}


def kept_up(models_dir: Path, rounds: int) -> None:
    """The batches on each arm in turn, `rounds` times, and their table."""
    measured = [
        (arm, kept_batches(models_dir, environment))
        for _ in range(rounds)
        for arm, environment in MALLOC_ARMS.items()
    ]
    print(
        "\n| host | batch | runs | peak GB (all) | x the first | host RSS before GB | after GB "
        "| after/before | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for arm, batches in measured:
        first = batches[0].peak_gb
        for i, b in enumerate(batches, 1):
            print(
                f"| {arm if i == 1 else ''} | {i} | {b.runs} | {b.peak_gb:.2f} | "
                f"{b.peak_gb / first:.2f}x | {b.host_before_gb:.2f} | {b.host_after_gb:.2f} | "
                f"{b.host_after_gb / b.host_before_gb:.2f} | {b.seconds:.1f} |"
            )
    for arm in MALLOC_ARMS:
        walls = [sum(b.seconds for b in batches) for a, batches in measured if a == arm]
        print(f"{arm}: the three batches' wall time {statistics.median(walls):.1f} s (median)")
    print("goals: the 4 at most 1.6x the first 1; the host after each batch within 10% of before")


def kept_batches(models_dir: Path, environment: dict[str, str]) -> list[Batch]:
    """1 run, then 4 at once, then 1 again, on one server and one host kept up, the host
    started here with `environment` for its defaults (the server adopts it)."""
    with tempfile.TemporaryDirectory() as tmp:
        var = Path(tmp) / "var"
        env = {"RLCS_MODELS_DIR": str(models_dir), "RLCS_MAX_CONCURRENT_RUNS": "8"}
        with LiveServer(var, None, **env) as server:
            api = httpx.Client(base_url=server.url, timeout=60)
            shipped = engine_host.HOST_ENVIRONMENT
            engine_host.HOST_ENVIRONMENT = environment
            try:
                engine_host.ensure(Settings(var_dir=var, models_path=models_dir))
            finally:
                engine_host.HOST_ENVIRONMENT = shipped
            batches = []
            for count in (1, 4, 1):
                before = settled_rss(var)
                with PeakMemory(server, with_server=True) as memory:
                    seconds = runs_at_once(api, count, "shared")
                wait_for(lambda: not any(h["bases"] for h in engine_of(api)), 60)
                after = settled_rss(var)
                batches.append(Batch(count, memory.peak / 1e9, before, after, seconds))
    return batches


def engine_of(api: httpx.Client) -> list[dict]:
    hosts: list[dict] = api.get("/engine").json()["hosts"]
    return hosts


def two_hosts(models_dir: Path) -> None:
    """Runs on bases X, Y, X at once on two hosts against one host (X SmolLM2, Y a copy of
    its folder: another base of the same size)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "smollm2-copy"
        shutil.copytree(smollm2_converted_dir(models_dir), copy)
        for hosts in ("1", "2"):
            print(on_hosts(models_dir, Path(tmp) / f"var-{hosts}", hosts, [SMOLLM2, str(copy)]))


def on_hosts(models_dir: Path, var: Path, hosts: str, bases: list[str]) -> str:
    """3 runs on bases[0], bases[1], bases[0] at once on `hosts` engine hosts, in words."""
    env = {
        "RLCS_MODELS_DIR": str(models_dir),
        "RLCS_MAX_CONCURRENT_RUNS": "8",
        "RLCS_ENGINE_HOSTS": hosts,
    }
    with LiveServer(var, None, **env) as server:
        api = httpx.Client(base_url=server.url, timeout=60)
        with PeakMemory(server, with_server=True) as memory, BasesSeen(api) as seen:
            seconds = runs_at_once(api, 3, "shared", [bases[0], bases[1], bases[0]])
    where = "; ".join(
        f"{name}: {', '.join(b.split('/')[-1] for b in held)}"
        for name, held in sorted(seen.loaded.items())
    )
    return (
        f"{hosts} host(s): {seconds:.1f} s, peak {memory.peak / 1e9:.2f} GB (all), "
        f"{len(seen.loaded)} host(s) made; bases loaded: {where}"
    )


class BasesSeen(Watch):
    """The bases each host had loaded at once at most, looked at every half second while the
    block runs."""

    def __init__(self, api: httpx.Client) -> None:
        super().__init__(0.5)
        self._api = api
        self.loaded: dict[str, list[str]] = {}

    def look(self) -> None:
        for host in engine_of(self._api):
            held = [b["name"] for b in host["bases"] if b["loaded"]]
            if len(held) > len(self.loaded.get(host["name"], [])):
                self.loaded[host["name"]] = held


if __name__ == "__main__":
    main()
