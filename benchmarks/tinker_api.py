"""The Tinker API's overhead: one RL loop run through the API (the real tinker SDK against a
live `python -m server`, its engine host process doing the work) and in-process on the local
backend (LocalServiceClient), side by side, the same work in each (same seeds: the same
tokens are sampled and trained).

Each step: 64 sample requests of one 64-token sequence each (as GEM-style scripts send them),
forward_backward with importance sampling over the 64 sequences and optim_step submitted
back to back, then a new sampler over the new weights. Rounds alternate (API, in-process, ...)
and the median step of each is compared. Each round runs in fresh processes (a new server and
engine; a child process for the in-process loop), so neither side inherits the other's memory
(SmolLM2's forward_backward over 64 x 96 tokens peaks near 10 GB on the CPU).

Run from the repo root (SmolLM2 on the CPU by default; --model tiny-random is quick):
    .venv/bin/python -m benchmarks.tinker_api --steps 3 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tinker
from tinker import types

from core.model_names import SMOLLM2
from core.settings import PROJECT_ROOT
from runners.engine.local import LocalServiceClient
from tests.support.live_server import LiveServer

KEY = "tml-benchmark"


@dataclass
class Timings:
    sample: list[float] = field(default_factory=list)
    train: list[float] = field(default_factory=list)
    refresh: list[float] = field(default_factory=list)
    step: list[float] = field(default_factory=list)

    def add(self, other: Timings) -> None:
        for name in ("sample", "train", "refresh", "step"):
            getattr(self, name).extend(getattr(other, name))


def prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 250, size=length).tolist() for _ in range(count)]  # any vocab


def datum(prompt: list[int], sequence: types.SampledSequence, advantage: float) -> types.Datum:
    tokens = prompt + list(sequence.tokens)
    n = len(tokens) - 1
    sampled = len(sequence.tokens)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.array(tokens[1:], dtype=np.int64)),
            "logprobs": types.TensorData.from_numpy(
                np.array([0.0] * (n - sampled) + list(sequence.logprobs), dtype=np.float32)
            ),
            "advantages": types.TensorData.from_numpy(
                np.array([0.0] * (n - sampled) + [advantage] * sampled, dtype=np.float32)
            ),
        },
    )


async def rl_loop(training: Any, sampler: Any, steps: int, args: argparse.Namespace) -> Timings:
    """`steps` RL steps after one warm-up step; the sampler of each step comes from the last."""
    timings = Timings()
    batch = prompts(args.requests, args.prompt_tokens)
    adam = types.AdamParams(learning_rate=1e-5, beta1=0.9, beta2=0.95, eps=1e-8)
    for step in range(steps + 1):
        started = time.perf_counter()
        params = [
            types.SamplingParams(
                max_tokens=args.tokens, temperature=1.0, seed=step * 1000 + i, stop=[]
            )
            for i in range(len(batch))
        ]
        responses = await asyncio.gather(
            *(
                sampler.sample(types.ModelInput.from_ints(p), 1, sp)
                for p, sp in zip(batch, params, strict=True)
            )
        )
        sampled = time.perf_counter()
        rewards = [float(np.mean(r.sequences[0].tokens) % 2) for r in responses]
        mean = float(np.mean(rewards))
        data = [
            datum(p, r.sequences[0], reward - mean)
            for p, r, reward in zip(batch, responses, rewards, strict=True)
        ]
        fwd_bwd = training.forward_backward(data, "importance_sampling")
        optim = training.optim_step(adam)
        await fwd_bwd
        await optim
        trained = time.perf_counter()
        sampler = await training.save_weights_and_get_sampling_client()
        done = time.perf_counter()
        if step == 0:
            continue  # warm-up: first-use costs (the sampler's copy of the model, caches)
        timings.sample.append(sampled - started)
        timings.train.append(trained - sampled)
        timings.refresh.append(done - trained)
        timings.step.append(done - started)
    return timings


def through_api(server: LiveServer, args: argparse.Namespace) -> Timings:
    service = tinker.ServiceClient(base_url=server.url, api_key=KEY)
    try:
        training = service.create_lora_training_client(args.model, rank=8, seed=0).result()
        sampler = training.save_weights_and_get_sampling_client().result()
        return asyncio.run(rl_loop(training, sampler, args.steps, args))
    finally:
        service.close("success").result(30)


def in_process(models_dir: Path, folder: Path, args: argparse.Namespace) -> Timings:
    service = LocalServiceClient(checkpoint_dir=folder, models_dir=models_dir, device="cpu")
    try:
        training = service.create_lora_training_client(args.model, rank=8, seed=0).result()
        sampler = training.save_weights_and_get_sampling_client().result()
        return asyncio.run(rl_loop(training, sampler, args.steps, args))
    finally:
        service.close()


def in_process_child(args: argparse.Namespace, folder: Path) -> Timings:
    """`in_process` in a child process of its own (its memory goes with it)."""
    argv = [sys.executable, "-m", "benchmarks.tinker_api", "--in-process-round", str(folder)]
    for name in ("model", "models_dir", "steps", "requests", "tokens", "prompt_tokens"):
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    done = subprocess.run(argv, cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    return Timings(**json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SMOLLM2)
    parser.add_argument("--models-dir", type=Path, default=PROJECT_ROOT / "var" / "models")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64, help="sample requests per step")
    parser.add_argument("--tokens", type=int, default=64, help="tokens sampled per request")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--in-process-round", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["TINKER_TELEMETRY"] = "0"
    if args.in_process_round is not None:  # the child of in_process_child
        print(json.dumps(asdict(in_process(args.models_dir, args.in_process_round, args))))
        return

    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}; {args.model}; {args.requests} x "
        f"{args.tokens} tokens sampled per step, {args.steps} steps x {args.rounds} rounds"
    )
    api, local = Timings(), Timings()
    env = {
        "RLCS_MODELS_DIR": str(args.models_dir.resolve()),
        "RLCS_DEVICE": "cpu",
        "RLCS_SUPERVISOR_INTERVAL_S": "0.5",  # the default (tests' servers tick faster)
    }
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            with LiveServer(Path(tmp) / f"var-{round_}", **env) as server:
                api.add(through_api(server, args))
            local.add(in_process_child(args, Path(tmp) / f"local-{round_}"))
            print(
                f"round {round_ + 1}: API step {statistics.median(api.step):.2f} s, "
                f"in-process {statistics.median(local.step):.2f} s",
                flush=True,
            )

    print(f"\n{'median of':<26}{'API':>10}{'in-process':>12}{'ratio':>8}")
    for name in ("sample", "train", "refresh", "step"):
        a, b = statistics.median(getattr(api, name)), statistics.median(getattr(local, name))
        label = {
            "sample": f"sample {args.requests} x {args.tokens}",
            "train": "forward_backward + optim",
            "refresh": "new sampler",
            "step": "whole step",
        }[name]
        print(f"{label:<26}{a:>9.2f}s{b:>11.2f}s{a / b:>7.2f}x")
    ratio = statistics.median(api.step) / statistics.median(local.step)
    print(f"\nAPI overhead: {ratio:.3f}x the in-process step (goal: at most 1.1x)")


if __name__ == "__main__":
    main()
