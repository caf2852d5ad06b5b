"""A sweep of RL runs on one base, side by side in one run: all at once in one engine (the
engine host's way: one copy of the weights, shared decode batches, training lanes) against a
few at a time, each in a process of its own with its own copy (private runs).

Each run: a LoRA client (rank 8, its own seed), then `--steps` RL steps as local_backend.py's
`time_rl_step` takes them (sample `--episodes` x `--new-tokens`, importance-sampling
forward_backward, optim_step, a new sampler). Issue 43's GPU goal: 8 runs of a 1.5B sweep all
at once end at least 2x sooner than two at a time in private processes.

    .venv/bin/python -m benchmarks.training_lanes --model tiny-random --steps 2   # seconds
    python3 -m benchmarks.training_lanes --device cuda --model random-1.5b        # a GPU
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.local_backend import RANDOM_SHAPES, build_random, random_prompts, time_rl_step
from runners.engine.local import LocalServiceClient

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def service(args: argparse.Namespace, folder: Path, lanes: int) -> LocalServiceClient:
    return LocalServiceClient(
        checkpoint_dir=folder / "checkpoints",
        models_dir=Path(args.models_dir),
        device=args.device,
        training_lanes=lanes,
    )


def one_run(engine: LocalServiceClient, model: str, seed: int, args: argparse.Namespace) -> None:
    trainer = engine.create_lora_training_client(model, rank=8, seed=seed).result()
    vocab = int(trainer._host.model.get_output_embeddings().weight.shape[0])
    prompts = random_prompts(max(1, args.episodes // 16), vocab)
    for _ in range(args.steps):
        time_rl_step(trainer, prompts, args.episodes, args.new_tokens)
    engine.forget(trainer)


def all_at_once(model: str, args: argparse.Namespace, folder: Path) -> float:
    """Every run on its own thread against one engine, its model loaded by the first run."""
    started = time.perf_counter()
    engine = service(args, folder / "shared", args.lanes)
    try:
        with ThreadPoolExecutor(args.runs) as pool:
            list(pool.map(lambda seed: one_run(engine, model, seed, args), range(args.runs)))
    finally:
        engine.close()
    return time.perf_counter() - started


def a_few_at_a_time(model: str, args: argparse.Namespace) -> float:
    """Every run in a process of its own (`--one-run`), `--at-once` of them at a time."""

    def run(seed: int) -> None:
        command = [sys.executable, "-m", "benchmarks.training_lanes", "--one-run", str(seed)]
        command += ["--model", model, "--device", args.device, "--models-dir", args.models_dir]
        command += ["--steps", str(args.steps), "--episodes", str(args.episodes)]
        command += ["--new-tokens", str(args.new_tokens)]
        subprocess.run(command, cwd=PROJECT_ROOT, check=True)

    started = time.perf_counter()
    with ThreadPoolExecutor(args.at_once) as pool:
        list(pool.map(run, range(args.runs)))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random-1.5b", help="a random shape, or a model name")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models-dir", default=str(PROJECT_ROOT / "var" / "models"))
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--at-once", type=int, default=2, help="private processes at a time")
    parser.add_argument("--lanes", type=int, default=2, help="the one engine's training lanes")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--one-run", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run is not None:  # a private run's process
        with tempfile.TemporaryDirectory() as tmp:
            engine = service(args, Path(tmp), lanes=1)
            try:
                one_run(engine, args.model, args.one_run, args)
            finally:
                engine.close()
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = build_random(args.model, folder) if args.model in RANDOM_SHAPES else args.model
        print(
            f"# {args.model} on {args.device}: {args.runs} runs x {args.steps} RL steps "
            f"({args.episodes} x {args.new_tokens} tokens each), LoRA rank 8",
            flush=True,
        )
        shared = all_at_once(model, args, folder)
        print(
            f"all at once in one engine (training lanes: {args.lanes}): {shared:.1f} s", flush=True
        )
        private = a_few_at_a_time(model, args)
        print(f"{args.at_once} at a time in their own processes: {private:.1f} s", flush=True)
        print(f"the sweep ends {private / shared:.2f}x sooner in one engine (goal at least 2x)")


if __name__ == "__main__":
    main()
