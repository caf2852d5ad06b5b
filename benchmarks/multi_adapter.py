"""Many tenants, one batch: N clients sampling at once, each on its own LoRA adapter, against
one adapter per batch (the sampler's former rule, kept as `adapter_slots=1`) and against the
same N clients on one shared adapter (the ceiling), side by side in one run.

Parts (all by default; `--parts` picks):
- products: the mixed-adapter LoRA product alone (benchmarks/adapter_products.py).
- engine: in this process, a LocalServiceClient per mode on `--model` (SmolLM2; on a GPU a
  random-weight shape: random-135m, random-1.5b); N in `--counts` clients, each a rank-8
  adapter one optimizer step from its own seed, each sampling `--rows` rows of exactly
  `--tokens` tokens at the same moment: aggregate tokens/s, each client's latency against one
  client alone; and a client sending requests back to back while another arrives.
- server: the same through the server's Tinker API (the tinker SDK, one ServiceClient per
  session, a live server per mode): 1 session alone, 8 on distinct adapters, 8 on one shared
  adapter; the engine host's memory with 1 adapter and with 8 of 3 ranks.
- v1: 4 concurrent /v1/chat/completions (n=4, exactly `--tokens` tokens) on 4 runs'
  checkpoints, mixed against one adapter per batch (the same runs, a server per mode).
- kernel (not in the default parts; the CPU): in this process, 8 clients mixed, 8 on one
  shared adapter and one alone, each in a service whose bf16 sampler adds the adapter updates
  through the fused kernel (sample/lora_rows.py), one that also computes its logits from a
  float32 unembedding (cast_lm_head_to_fp32) and one through torch's products, rounds
  alternating.

Run from the repo root (SmolLM2 on the CPU; the whole run takes about 25 minutes on 2 cores):
    .venv/bin/python -m benchmarks.multi_adapter [--parts engine,server] [--rounds 2]
On a GPU (benchmarks/gpu_check.sh): --parts engine --device cuda --model random-1.5b --rows 8
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tinker import types

from benchmarks import adapter_products
from core.model_names import SMOLLM2, smollm2_is_converted
from runners.engine import openmp
from runners.engine.local import LocalServiceClient

if TYPE_CHECKING:  # the server parts' imports (a GPU image may lack the server's packages)
    import httpx

    from tests.support.live_server import LiveServer

PROJECT_ROOT = Path(__file__).resolve().parents[1]

KEY = "tml-benchmark"
PROMPT = list(range(200, 232))  # 32 prompt tokens (any ids in SmolLM2's vocabulary)
ADAM = types.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8)
MODES = {"one adapter per batch": 1, "mixed batches": 8}


@dataclass
class Timed:
    """One concurrent round: its wall time and each client's latency (seconds)."""

    seconds: float
    latencies: list[float]
    tokens: int

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


def params(tokens: int, seed: int) -> types.SamplingParams:
    return types.SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed, stop=[])


def one_step(client: Any, seed: int) -> None:
    """One optimizer step on a few tokens: the adapter's B leaves zero (every adapter differs)."""
    tokens = [PROMPT[i % len(PROMPT)] + seed for i in range(24)]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 23},
    )
    client.forward_backward([datum], "cross_entropy").result()
    client.optim_step(ADAM).result()


# ----- engine: in this process ---------------------------------------------------------------


def engine_round(samplers: list[Any], rows: int, tokens: int, seed: int) -> Timed:
    """Every sampler's request submitted at once; each one's latency from that moment."""
    started = time.perf_counter()
    ended: list[float] = [0.0] * len(samplers)
    futures = []
    for i, sampler in enumerate(samplers):
        future = sampler.sample(
            types.ModelInput.from_ints(PROMPT),
            rows,
            params(tokens, seed + i),
            min_tokens=tokens,
            ignore_eos=True,
        )
        future.add_done_callback(lambda _, i=i: ended.__setitem__(i, time.perf_counter()))
        futures.append(future)
    decoded = sum(len(s.tokens) for f in futures for s in f.result().sequences)
    assert decoded == len(samplers) * rows * tokens
    return Timed(max(ended) - started, [e - started for e in ended], decoded)


def engine_part(models_dir: Path, args: argparse.Namespace) -> None:
    from benchmarks.local_backend import RANDOM_SHAPES, build_random

    openmp.set_sole_engine(True)  # as in the engine host, this process is the machine's engine

    counts = tuple(int(c) for c in args.counts.split(","))
    results: dict[tuple[str, int], list[Timed]] = {}
    back_to_back: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model in RANDOM_SHAPES:
            model = build_random(model, Path(tmp))
        services = {
            mode: LocalServiceClient(
                checkpoint_dir=Path(tmp) / str(slots),
                models_dir=models_dir,
                device=args.device,
                adapter_slots=slots,
                cpu_adapter_kernel=args.kernel,
            )
            for mode, slots in MODES.items()
        }
        try:
            clients = {}
            for mode, service in services.items():
                trainers = [
                    service.create_lora_training_client(model, rank=8, seed=s).result()
                    for s in range(max(counts))
                ]
                for seed, trainer in enumerate(trainers):
                    one_step(trainer, seed)
                clients[mode] = [
                    t.save_weights_and_get_sampling_client().result() for t in trainers
                ]
                # Each client on one shared adapter: the first trainer's, sampled as its own.
                shared = trainers[0].save_weights_and_get_sampling_client().result()
                clients[f"{mode}, shared"] = [
                    _as_client(shared, f"shared-{i}") for i in range(max(counts))
                ]
            runs = [
                ("one adapter per batch", ""),
                ("mixed batches", ""),
                ("mixed batches", ", shared"),
            ]
            for samplers in clients.values():
                engine_round(samplers[:1], args.rows, 4, 0)  # warm: the sampling copy, caches
            for round_ in range(args.rounds):
                for count in counts:
                    for mode, suffix in runs:
                        samplers = clients[mode + suffix][:count]
                        timed = engine_round(samplers, args.rows, args.tokens, 100 * round_)
                        results.setdefault((mode + suffix, count), []).append(timed)
                for mode in MODES:
                    back_to_back.setdefault(mode, []).append(
                        newcomer_delay(clients[mode][:2], args.rows, args.tokens)
                    )
                print(f"engine round {round_ + 1} done", flush=True)
        finally:
            for service in services.values():
                service.close()
    shape = f"N clients x {args.rows} rows x {args.tokens} tokens, {args.model}, rank 8"
    print(f"\n## In the engine: {shape}")
    print("(best round of each; latency: each client's, against one client alone in that mode)")
    print(
        "| mode | N | seconds | tokens/s | x one alone | slowest / fastest | max latency x alone |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (label, count), rounds in results.items():
        best = min(rounds, key=lambda t: t.seconds)
        alone = min(results[(label, 1)], key=lambda t: t.seconds)
        print(
            f"| {label} | {count} | {best.seconds:.2f} | {best.rate:.0f} | "
            f"{best.rate / alone.rate:.2f}x | {max(best.latencies) / min(best.latencies):.2f} | "
            f"{max(best.latencies) / alone.seconds:.2f}x |"
        )
    for count in counts:
        mixed = min(t.seconds for t in results[("mixed batches", count)])
        one = min(t.seconds for t in results[("one adapter per batch", count)])
        shared = min(t.seconds for t in results[("mixed batches, shared", count)])
        print(
            f"N={count}: mixed {one / mixed:.2f}x one adapter per batch; "
            f"{shared / mixed:.2f}x the shared adapter's rate"
        )
    for mode, delays in back_to_back.items():
        print(
            f"back to back ({mode}): a newcomer's request took {min(delays):.2f}x "
            "(its time alone + one request of the busy client)"
        )


# (label, the fused kernel, a float32 unembedding: cast_lm_head_to_fp32)
KERNEL_MODES = (
    ("fused kernel", True, False),
    ("fused kernel, float32 head", True, True),
    ("torch products", False, False),
)


def kernel_part(models_dir: Path, args: argparse.Namespace) -> None:
    openmp.set_sole_engine(True)  # as in the engine host
    count = 8
    rates: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        modes: dict[str, tuple[LocalServiceClient, dict[str, list[Any]]]] = {}
        for label, kernel, fp32_head in KERNEL_MODES:
            service = LocalServiceClient(
                checkpoint_dir=Path(tmp) / label,
                models_dir=models_dir,
                device="cpu",
                cpu_adapter_kernel=kernel,
                cast_lm_head_to_fp32=fp32_head,
            )
            trainers = [
                service.create_lora_training_client(args.model, rank=8, seed=s).result()
                for s in range(count)
            ]
            for seed, trainer in enumerate(trainers):
                one_step(trainer, seed)
            samplers = [t.save_weights_and_get_sampling_client().result() for t in trainers]
            shared = trainers[0].save_weights_and_get_sampling_client().result()
            clients = {
                "8 mixed": samplers,
                "8 on one shared adapter": [_as_client(shared, f"s{i}") for i in range(count)],
                "one alone": samplers[:1],
            }
            engine_round(samplers, args.rows, 4, 0)  # warm
            modes[label] = (service, clients)
        try:
            for round_ in range(args.rounds):
                for label, (_, clients) in modes.items():
                    for case, samplers in clients.items():
                        timed = engine_round(samplers, args.rows, args.tokens, 100 * round_)
                        rates.setdefault((label, case), []).append(timed.rate)
                print(f"kernel round {round_ + 1} done", flush=True)
        finally:
            for service, _ in modes.values():
                service.close()
    print(
        f"\n## The fused kernel against torch's products: {args.rows} rows x {args.tokens} tokens"
    )
    print("| adapter updates | 8 mixed | 8 on one shared adapter | one alone | mixed x alone "
          "| mixed / shared |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for label in modes:
        mixed, shared, alone = (
            max(rates[(label, case)])
            for case in ("8 mixed", "8 on one shared adapter", "one alone")
        )
        print(
            f"| {label} | {mixed:.0f} tok/s | {shared:.0f} | {alone:.0f} | {mixed / alone:.2f}x "
            f"| {mixed / shared:.2f} |"
        )


class _as_client:
    """A sampler seen as another client (its requests take turns under that name)."""

    def __init__(self, sampler: Any, client: str) -> None:
        self._sampler, self._client = sampler, client

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        return self._sampler.sample(*args, client=self._client, **kwargs)


def newcomer_delay(samplers: list[Any], rows: int, tokens: int) -> float:
    """Client A sends requests back to back; once its second is decoding, B sends one. B's
    latency against B alone plus one of A's requests (what "one decode round of it" allows)."""
    busy, newcomer = samplers
    alone = engine_round([newcomer], rows, tokens, 7).seconds
    one_request = engine_round([busy], rows, tokens, 8).seconds
    stop = threading.Event()
    second = threading.Event()
    sent = 0

    def keep_sending() -> None:
        nonlocal sent
        while not stop.is_set():
            sent += 1
            if sent == 2:
                second.set()
            engine_round([busy], rows, tokens, 10 + sent)

    sender = threading.Thread(target=keep_sending)
    sender.start()
    try:
        second.wait(timeout=600)
        time.sleep(0.05 * tokens / 16)  # into its decoding, so B arrives mid-request
        latency = engine_round([newcomer], rows, tokens, 9).seconds
    finally:
        stop.set()
        sender.join(timeout=600)
    return latency / (alone + one_request)


# ----- server: the Tinker API ----------------------------------------------------------------


def server_part(models_dir: Path, args: argparse.Namespace) -> None:
    import tinker

    from tests.support.live_server import LiveServer

    rates: dict[str, list[Timed]] = {}
    memory: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, slots in MODES.items():
            env = _server_env(models_dir, slots, args.kernel)
            with LiveServer(Path(tmp) / f"var-{slots}", **env) as server:
                sessions = [
                    tinker.ServiceClient(base_url=server.url, api_key=KEY) for _ in range(8)
                ]
                try:
                    trainers = [
                        s.create_lora_training_client(SMOLLM2, rank=8, seed=i).result()
                        for i, s in enumerate(sessions)
                    ]
                    for i, trainer in enumerate(trainers):
                        one_step(trainer, i)
                    samplers = [t.save_weights_and_get_sampling_client().result() for t in trainers]
                    sdk_round(samplers[:1], args.rows, 4, 0)  # warm
                    for round_ in range(args.rounds):
                        for label, chosen in (
                            ("1 session", samplers[:1]),
                            ("8 sessions, distinct adapters", samplers),
                            ("8 sessions, one shared adapter", [samplers[0]] * 8),
                        ):
                            timed = sdk_round(chosen, args.rows, args.tokens, 100 * round_)
                            rates.setdefault(f"{mode}: {label}", []).append(timed)
                        print(f"server round {round_ + 1} ({mode}) done", flush=True)
                finally:
                    for session in sessions:
                        session.close("success").result(30)
            with LiveServer(Path(tmp) / f"memory-{slots}", **env) as server:
                memory[mode] = host_memory(server, args.rows)
    print(f"\n## Through the Tinker API: 8 sessions x {args.rows} rows x {args.tokens} tokens")
    print("| mode: sessions | seconds | tokens/s | x 1 session alone | slowest / fastest |")
    print("|---|---:|---:|---:|---:|")
    for label, rounds in rates.items():
        best = min(rounds, key=lambda t: t.seconds)
        mode = label.split(":")[0]
        alone = min(rates[f"{mode}: 1 session"], key=lambda t: t.seconds)
        print(
            f"| {label} | {best.seconds:.2f} | {best.rate:.0f} | {best.rate / alone.rate:.2f}x | "
            f"{max(best.latencies) / min(best.latencies):.2f} |"
        )
    mixed = max(t.rate for t in rates["mixed batches: 8 sessions, distinct adapters"])
    shared = max(t.rate for t in rates["mixed batches: 8 sessions, one shared adapter"])
    print(f"distinct adapters: {mixed / shared:.2f} of the shared adapter's rate (goal >= 0.9)")
    for mode, (one, eight) in memory.items():
        print(
            f"engine host ({mode}): {one:.2f} GB with 1 session sampled, {eight:.2f} GB with "
            "8 (ranks 8, 16, 32; each sampled)"
        )


def host_memory(server: LiveServer, rows: int) -> tuple[float, float]:
    """The engine host's resident GB with one session sampled, then with 8 of 3 ranks."""
    import tinker

    sessions = [tinker.ServiceClient(base_url=server.url, api_key=KEY) for _ in range(8)]
    try:
        sizes = []
        for i, session in enumerate(sessions):
            rank = (8, 16, 32)[i % 3]
            trainer = session.create_lora_training_client(SMOLLM2, rank=rank, seed=i).result()
            one_step(trainer, i)
            sampler = trainer.save_weights_and_get_sampling_client().result()
            sdk_round([sampler], rows, 8, i)
            if i in (0, 7):
                sizes.append(_host_memory(server))
        return sizes[0], sizes[1]
    finally:
        for session in sessions:
            session.close("success").result(30)


def sdk_round(samplers: list[Any], rows: int, tokens: int, seed: int) -> Timed:
    """Each sampler's request from a thread of its own, all at once (as 8 scripts would)."""
    barrier = threading.Barrier(len(samplers))

    def one(i: int) -> tuple[float, int]:
        barrier.wait()
        response = (
            samplers[i]
            .sample(types.ModelInput.from_ints(PROMPT), rows, params(tokens, seed + i))
            .result()
        )
        return time.perf_counter(), sum(len(s.tokens) for s in response.sequences)

    started = time.perf_counter()
    with ThreadPoolExecutor(len(samplers)) as pool:
        done = list(pool.map(one, range(len(samplers))))
    ended = [t for t, _ in done]
    return Timed(max(ended) - started, [e - started for e in ended], sum(n for _, n in done))


def _server_env(models_dir: Path, slots: int, kernel: bool) -> dict[str, str]:
    return {
        "RLCS_MODELS_DIR": str(models_dir),
        "RLCS_DEVICE": "cpu",
        "RLCS_ADAPTER_SLOTS": str(slots),
        "RLCS_CPU_ADAPTER_KERNEL": str(kernel).lower(),
        "RLCS_SUPERVISOR_INTERVAL_S": "0.5",
        "RLCS_INFERENCE_BUDGET_S": "600",
        "RLCS_INFERENCE_TIMEOUT_S": "600",
        "TINKER_TELEMETRY": "0",
    }


def _host_memory(server: LiveServer) -> float:
    """Resident GB of the server's engine host (where the Tinker API's models live)."""
    import psutil

    from core import engine_host

    record = engine_host.running(server.var_dir)
    if record is None:
        raise RuntimeError("no engine host is running for this server")
    return psutil.Process(record.pid).memory_info().rss / 1e9


# ----- /v1 on several checkpoints --------------------------------------------------------------


def v1_part(models_dir: Path, args: argparse.Namespace) -> None:
    import httpx

    from benchmarks.v1_speed import RUN  # one step of repeat_word: a rank-8 checkpoint
    from tests.support.helpers import finish_run, start_run
    from tests.support.live_server import LiveServer

    seconds: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        var = Path(tmp) / "var"
        runs: list[str] = []
        for mode, slots in MODES.items():  # the same var folder: the same runs in each mode
            with LiveServer(var, **_server_env(models_dir, slots, args.kernel)) as server:
                with httpx.Client(base_url=server.url, timeout=1800) as api:
                    if not runs:
                        runs = [start_run(api, **RUN, seed=i) for i in range(4)]
                        for run in runs:
                            assert finish_run(api, run, timeout=1800)["status"] == "succeeded"
                    chats(api, runs, 1, 4)  # warm: the four samplers loaded
                    for _ in range(args.rounds):
                        seconds.setdefault(mode, []).append(chats(api, runs, 4, args.tokens))
    print(f"\n## /v1: 4 concurrent requests (n=4, {args.tokens} tokens) on 4 runs' checkpoints")
    for mode, values in seconds.items():
        print(f"{mode}: {min(values):.2f} s ({4 * 4 * args.tokens / min(values):.0f} tokens/s)")
    ratio = min(seconds["one adapter per batch"]) / min(seconds["mixed batches"])
    print(f"mixed: {ratio:.2f}x faster than one adapter per batch (goal: at least 2x)")


def chats(api: httpx.Client, runs: list[str], n: int, tokens: int) -> float:
    def one(i: int) -> None:
        body = {
            "model": runs[i],
            "messages": [{"role": "user", "content": "Tell me about rivers."}],
            "max_tokens": tokens,
            "min_tokens": tokens,
            "ignore_eos": True,
            "n": n,
            "seed": i,
        }
        answer = api.post("/v1/chat/completions", json=body)
        answer.raise_for_status()
        assert answer.json()["usage"]["completion_tokens"] == n * tokens

    started = time.perf_counter()
    with ThreadPoolExecutor(len(runs)) as pool:
        list(pool.map(one, range(len(runs))))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="products,engine,server,v1")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4, help="rows per client's request")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per row, exactly")
    parser.add_argument("--models-dir", type=Path, default=PROJECT_ROOT / "var" / "models")
    parser.add_argument("--model", default=SMOLLM2, help="the engine part's (random-1.5b...)")
    parser.add_argument("--device", default="cpu", help="the engine part's")
    parser.add_argument("--counts", default="1,2,4,8", help="the engine part's clients")
    parser.add_argument(
        "--no-kernel",
        dest="kernel",
        action="store_false",
        help="the torch products instead of the CPU's fused adapter kernel (lora_rows.py)",
    )
    args = parser.parse_args()
    os.environ["TINKER_TELEMETRY"] = "0"
    models_dir = args.models_dir.resolve()
    if args.model == SMOLLM2 and not smollm2_is_converted(models_dir):
        raise SystemExit(f"SmolLM2 is not converted in {models_dir}: run make install first")
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__}; best of {args.rounds} rounds"
    )
    parts: dict[str, Callable[[], None]] = {
        "products": lambda: adapter_products.report([4, 8, 16, 32], [1, 2, 4, 8], 15),
        "engine": lambda: engine_part(models_dir, args),
        "server": lambda: server_part(models_dir, args),
        "v1": lambda: v1_part(models_dir, args),
        "kernel": lambda: kernel_part(models_dir, args),
    }
    for name in args.parts.split(","):
        parts[name]()


if __name__ == "__main__":
    main()
