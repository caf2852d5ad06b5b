"""The engine's memory across RL runs that come and go, in one process as the engine host runs
it: one LocalServiceClient (training lanes 2, 8 adapter slots), batches of clients at once
(1, then 4, then 1), each on its own thread taking RL-shaped steps (a snapshot sampler, a group
of samples, importance-sampling forward_backward, optim_step), then released as the host
releases a client's models and samplers. Issue 52's goal: the peak of 4 at most 1.6x the peak
of 1, and the RSS after each batch within 10% of the RSS before it.

    .venv/bin/python -m benchmarks.engine_memory            # SmolLM2-135M, minutes on 2 cores
    .venv/bin/python -m benchmarks.engine_memory --quick    # tiny-random, seconds
    .venv/bin/python -m benchmarks.engine_memory --warm     # first-use costs paid before

A host runs with `core/engine_host.HOST_ENVIRONMENT` (oneDNN's cache, glibc's malloc
thresholds), read once as a process starts: set those variables to measure as a host runs.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from tinker import types

from benchmarks.rl_data import importance_data
from benchmarks.watch import Watch
from core.model_names import SMOLLM2, TINY_RANDOM
from runners.engine import openmp
from runners.engine.local import LocalServiceClient, LocalTrainingClient
from runners.engine.sample.sampler import LocalSamplingClient

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MB = 1e6
QUESTIONS = [
    "What is 7 times 8? Answer with a number.",
    "Name a primary colour and say why it is one.",
    "Write a haiku about the sea, please.",
    "Why is the sky blue? Answer in one sentence.",
    "List three fruits that grow on trees.",
    "What is the capital of Japan, and its largest city?",
    "Translate 'good morning' into French and German.",
    "Give me a word that rhymes with cat, and one with dog.",
]


class Mallinfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (2.33 on)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _mallinfo2() -> Callable[[], Mallinfo2] | None:
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = Mallinfo2
    return function


MALLINFO2 = _mallinfo2()


@dataclass
class Reading:
    rss: float  # MB
    pss: float | None  # MB (smaps_rollup)
    heap_in_use: float | None  # MB malloc hands out now (mallinfo2: uordblks + hblkhd)
    heap_free: float | None  # MB free inside malloc's arenas (fordblks)
    threads: int

    def line(self) -> str:
        extra = ""
        if self.heap_in_use is not None and self.heap_free is not None:
            extra = f"  malloc in use {self.heap_in_use:7.1f}  free in arenas {self.heap_free:7.1f}"
        pss = f"{self.pss:7.1f}" if self.pss is not None else "      -"
        return f"RSS {self.rss:7.1f}  Pss {pss}{extra}  threads {self.threads}"


def read_memory() -> Reading:
    process = psutil.Process()
    pss = None
    try:
        for row in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if row.startswith("Pss:"):
                pss = int(row.split()[1]) * 1024 / MB
    except OSError:
        pass
    in_use = free = None
    if MALLINFO2 is not None:
        info = MALLINFO2()
        in_use, free = (info.uordblks + info.hblkhd) / MB, info.fordblks / MB
    return Reading(process.memory_info().rss / MB, pss, in_use, free, process.num_threads())


class PeakWatch(Watch):
    """The process's highest RSS while it runs, read every `interval` seconds on a thread."""

    def __init__(self, interval: float) -> None:
        super().__init__(interval, name="peak-watch")
        self._process = psutil.Process()
        self.peak = 0.0

    def look(self) -> None:
        self.peak = max(self.peak, self._process.memory_info().rss / MB)


def rl_step(
    trainer: LocalTrainingClient, prompts: list[list[int]], args: argparse.Namespace
) -> LocalSamplingClient:
    """Sample a group per prompt from a snapshot of the adapter, then train on the samples
    (importance sampling) and step; the snapshot sampler is returned (the host keeps a
    session's samplers until the session is released)."""
    sampler = trainer.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=args.new_tokens, temperature=1.0, stop=[])
    futures = [sampler.sample(types.ModelInput.from_ints(p), args.group, params) for p in prompts]
    data = importance_data(prompts, [future.result() for future in futures])
    trainer.forward_backward(data, "importance_sampling")
    trainer.optim_step(types.AdamParams(learning_rate=1e-5)).result()
    return sampler


def one_client(service: LocalServiceClient, seed: int, args: argparse.Namespace) -> None:
    """A run: a LoRA client, `args.steps` RL steps, then released as the engine host releases
    a session (its samplers closed, then the model forgotten, pending requests cancelled)."""
    trainer = service.create_lora_training_client(args.model, rank=args.rank, seed=seed).result()
    tokenizer = trainer.get_tokenizer()
    questions = QUESTIONS[seed % len(QUESTIONS) :] + QUESTIONS
    prompts = [tokenizer.encode(q) for q in questions[: args.prompts]]
    samplers = []
    try:
        for _ in range(args.steps):
            samplers.append(rl_step(trainer, prompts, args))
    finally:
        for sampler in samplers:
            sampler.close()
        service.forget(trainer, cancel_pending=True)


def run_batch(
    service: LocalServiceClient, clients: int, first_seed: int, args: argparse.Namespace
) -> None:
    """`clients` runs at once, each on a thread of its own, until all are released."""
    threads = [
        threading.Thread(target=one_client, args=(service, first_seed + i, args), name=f"run-{i}")
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def what_stays(service: LocalServiceClient) -> str:
    """What the engine holds once every client is gone (it should hold nothing)."""
    from runners.engine.sample import scheduler

    with scheduler._schedulers_lock:
        schedulers = list(scheduler._schedulers.values())
    copies = sum(s._model is not None for s in schedulers)
    return (
        f"bases loaded {service.bases.loaded()}, decode schedulers registered "
        f"{len(schedulers)} ({sum(s.closed for s in schedulers)} closed, {copies} with a "
        f"sampling copy), recorded sequences {len(service.sequences)}"
    )


def trimmed() -> tuple[Reading, float]:
    """A reading after a garbage collection and glibc's malloc_trim(0), done here (what the
    engine left in malloc's free lists, against what it still references), and how long the
    trim took (s)."""
    gc.collect()
    started = time.perf_counter()
    ctypes.CDLL(None).malloc_trim(0)
    return read_memory(), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny-random: seconds")
    parser.add_argument("--model", default=None, help=f"default {SMOLLM2} ({TINY_RANDOM} quick)")
    parser.add_argument("--models-dir", default=str(PROJECT_ROOT / "var" / "models"))
    parser.add_argument("--batches", default="1,4,1", help="clients at once, batch after batch")
    parser.add_argument("--steps", type=int, default=4, help="RL steps per client")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--interval", type=float, default=0.05, help="s between RSS readings")
    parser.add_argument(
        "--warm",
        action="store_true",
        help="a tiny-random client first: what any first run pays once (imports, code pages) "
        "is paid before the first reading",
    )
    args = parser.parse_args()
    args.model = args.model or (TINY_RANDOM if args.quick else SMOLLM2)
    batches = [int(n) for n in args.batches.split(",")]

    openmp.set_sole_engine(True)  # as the engine host runs
    with tempfile.TemporaryDirectory() as tmp:
        service = LocalServiceClient(
            checkpoint_dir=Path(tmp) / "checkpoints",
            models_dir=Path(args.models_dir),
            training_lanes=2,
            adapter_slots=8,
        )
        if args.warm:
            warm_up = argparse.Namespace(**{**vars(args), "model": TINY_RANDOM, "steps": 1})
            run_batch(service, 1, 0, warm_up)
        gc.collect()
        start = read_memory()
        print(f"# {args.model}: batches {batches}, {args.steps} steps each, "
              f"{args.prompts} prompts x {args.group} samples x {args.new_tokens} tokens, "
              f"rank {args.rank}")  # fmt: skip
        print(f"before {'(warmed up)' if args.warm else 'anything'}  {start.line()}", flush=True)
        rows = []
        before, seed = start, 0
        for clients in batches:
            began = time.perf_counter()
            with PeakWatch(args.interval) as watch:
                run_batch(service, clients, seed, args)
            seed += clients
            gc.collect()
            after = read_memory()
            print(f"batch of {clients}: {time.perf_counter() - began:5.1f} s, peak "
                  f"{watch.peak:7.1f}; after {after.line()}", flush=True)  # fmt: skip
            rows.append((clients, before.rss, watch.peak, after.rss))
            before = after
        print(f"left in the engine: {what_stays(service)}")
        reading, took = trimmed()
        print(f"after gc + malloc_trim here ({took * 1e3:.1f} ms): {reading.line()}")
        service.close()

    print("\n| clients | RSS before (MB) | peak (MB) | RSS after (MB) | after / before |")
    print("|---|---|---|---|---|")
    for clients, rss_before, peak, rss_after in rows:
        ratio = rss_after / rss_before
        print(f"| {clients} | {rss_before:.0f} | {peak:.0f} | {rss_after:.0f} | {ratio:.2f} |")
    ones = [peak for clients, _, peak, _ in rows if clients == 1]
    if ones and any(clients > 1 for clients, *_ in rows):
        most = max(rows, key=lambda row: row[0])
        print(f"\npeak of {most[0]} / peak of the first 1: {most[2] / ones[0]:.2f} (goal <= 1.6)")
    worst = max(after / before for _, before, _, after in rows)
    print(f"worst after / before: {worst:.2f} (goal <= 1.10)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
