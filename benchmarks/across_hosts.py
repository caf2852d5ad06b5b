"""One run across several engine hosts (issue 55), side by side in one run, through the run's
own client (runners/backends): tiny-random and SmolLM2-135M, float32. Parts:

- `sample`: a sampling-bound step (one prompt, group 16 x 64 tokens, seeds 0-15) on one host
  with every core (the default), on one of two hosts (RLCS_ENGINE_HOSTS=2, a core each,
  `sample_hosts: 1`) and on both (`sample_hosts: 2`): tokens/s, the ratios, and whether the
  16 rows drew the same tokens and logprobs everywhere.
- `group`: 5 steps on 8 datums, one host against a group of two (4 + 4, gradients summed over
  gloo): the LoRA weights' largest difference, each step's time; and a sum all-reduce of an
  86M-float buffer (7B's LoRA at rank 32) between two gloo ranks of one process.

On a GPU (`--device cuda`, `benchmarks/gpu_check.sh across`): the 135M shape with random
weights, two hosts sharing GPU 0, bfloat16; the all-reduce over gloo on CUDA tensors.

Run from the repo root (about 12 minutes on 2 CPU cores):
    .venv/bin/python -m benchmarks.across_hosts [--parts sample,group] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from tinker import types

from benchmarks.host_pair import resolve
from benchmarks.rl_data import text_data
from core.model_names import SMOLLM2
from core.settings import Settings
from runners.backends.engine_backend import EngineService
from runners.backends.group_training import GroupTraining
from runners.backends.spread_sampling import SpreadSampling, spread
from runners.engine.train.group import GradientGroup
from tests.support.engine_hosts import stop_engine_hosts

GROUP, TOKENS = 16, 64


ADAM = types.AdamParams(learning_rate=4e-5, beta1=0.9, beta2=0.95, eps=1e-8)


DEVICE = "cpu"  # set by --device


def settings(folder: Path, hosts: str | None) -> Settings:
    """Float32 on the CPU; the GPU's defaults (bfloat16) there, two hosts sharing GPU 0."""
    if DEVICE == "cuda":
        two = "0,0" if hosts is not None else None
        return Settings(var_dir=folder / "var", engine_hosts=two, device="cuda")
    return Settings(
        var_dir=folder / "var",
        engine_hosts=hosts,
        device="cpu",
        dtype="float32",
        sampling_dtype="float32",
    )


async def sampler_on(
    config: Settings, model: str, hosts: int, folder: Path
) -> tuple[SpreadSampling, list[EngineService]]:
    services = EngineService.several(config, "bench", folder / "ckpt", model, hosts)
    training = await services[0].create_lora_training_client(model, rank=8, seed=0)
    home = await training.save_weights_and_get_sampling_client()
    return await spread(training, home, services[1:]), services


async def one_step(sampler: SpreadSampling, prompt: list[int]) -> tuple[float, list[Any]]:
    """The step's 16 rows, drawn at once; its seconds and the rows (tokens, logprobs)."""
    start = time.perf_counter()
    answers = await asyncio.gather(
        *(
            sampler.sample(
                types.ModelInput.from_ints(prompt),
                1,
                types.SamplingParams(max_tokens=TOKENS, seed=seed, temperature=1.0),
            )
            for seed in range(GROUP)
        )
    )
    rows = [(list(a.sequences[0].tokens), list(a.sequences[0].logprobs)) for a in answers]
    return time.perf_counter() - start, rows


async def one_by_one(sampler: Any, prompt: list[int]) -> list[Any]:
    """The step's 16 rows drawn one after another (each alone in its batch)."""
    rows = []
    for seed in range(GROUP):
        params = types.SamplingParams(max_tokens=TOKENS, seed=seed, temperature=1.0)
        answer = await sampler.sample(types.ModelInput.from_ints(prompt), 1, params)
        rows.append((list(answer.sequences[0].tokens), list(answer.sequences[0].logprobs)))
    return rows


def sample_part(models: list[str], rounds: int) -> None:
    arms = {"one host, all cores": (None, 1), "1 of 2 hosts": ("2", 1), "2 hosts": ("2", 2)}
    for model in models:
        folder = Path(tempfile.mkdtemp(prefix="across-"))
        try:
            asyncio.run(_sample_model(model, arms, rounds, folder))
        finally:
            stop_engine_hosts(folder)
            shutil.rmtree(folder, ignore_errors=True)


async def _sample_model(
    model: str, arms: dict[str, tuple[str | None, int]], rounds: int, folder: Path
) -> None:
    samplers: dict[str, SpreadSampling] = {}
    for name, (hosts, sample_hosts) in arms.items():
        where = folder / ("one" if hosts is None else "two")
        samplers[name], _ = await sampler_on(settings(where, hosts), model, sample_hosts, where)
    prompt = list(range(5, 37))
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    rows: dict[str, list[Any]] = {}
    for round_ in range(rounds + 1):  # the first round warms each arm up, uncounted
        for name, sampler in samplers.items():
            took, rows[name] = await one_step(sampler, prompt)
            if round_:
                seconds[name].append(took)
    tokens = sum(len(t) for t, _ in rows["2 hosts"])
    base = statistics.median(seconds["one host, all cores"])
    print(f"\n{model}: a step of {GROUP} x {TOKENS} tokens, median of {rounds}")
    for name, took in seconds.items():
        median = statistics.median(took)
        print(
            f"  {name:<20} {median:6.2f} s  {tokens / median:7.1f} tok/s  "
            f"{base / median:5.2f}x the default"
        )
    two, one_of_two = (
        statistics.median(seconds["2 hosts"]),
        statistics.median(seconds["1 of 2 hosts"]),
    )
    print(f"  sample_hosts 2 against 1 on the same two hosts: {one_of_two / two:.2f}x")
    # The goal's check: the same 16 requests to either host, one at a time (each row alone in
    # its batch). Drawn together, rows join the decode batch as they arrive, and a batch's size
    # rounds a float32 product otherwise, which can tip a token in a larger model.
    parts = samplers["2 hosts"].parts
    on_first, on_second = [await one_by_one(part, prompt) for part in parts[:2]]
    print(f"  the 16 rows on either host, one at a time, the same: {on_first == on_second}")
    same = [t for t, _ in rows["2 hosts"]] == [t for t, _ in rows["1 of 2 hosts"]]
    print(f"  tokens spread 8 + 8 the same as 16 in one batch: {same}")


TEXTS = [
    "hello world",
    "the cat sat",
    "a b c d",
    "RL on a CPU",
    "more text",
    "sums",
    "eight",
    "four",
]


async def _train(
    training: Any, data: list[types.Datum], steps: int
) -> tuple[list[float], list[float]]:
    """`steps` steps on `data`: each one's seconds and gradient norm."""
    times, norms = [], []
    for _ in range(steps):
        start = time.perf_counter()
        training.forward_backward(data, "importance_sampling")
        stepped = await training.optim_step(ADAM)
        times.append(time.perf_counter() - start)
        norms.append(stepped.metrics["grad_norm"])
    return times, norms


async def _weights(training: Any, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    saved = await training.save_weights_for_sampler(name)
    return load_file(Path(saved.path) / "adapter_model.safetensors")


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


async def _group_model(model: str, folder: Path) -> None:
    """A group of two (4 + 4) against one host on all 8 datums: cutting them as the group does
    (two micro-batches of 4), and in one pass (float32 rounds a product of 8 rows otherwise
    than two of 4). Every host on one core, as the group's two on 2 cores: a host's thread
    count also changes how a product's sums round."""
    one = EngineService.several(settings(folder / "one", "2"), "alone", folder / "a", model, 1)[0]
    alone = await one.create_lora_training_client(model, rank=8, seed=0)
    data = text_data(alone.get_tokenizer(), TEXTS, end=(1, 2))
    # A training pass's budget counts its rows at their longest: half the rows a micro-batch.
    half = max(d.model_input.length for d in data) * len(data) // 2
    halves_settings = settings(folder / "halves", "2").model_copy(
        update={"tokens_per_microbatch": half}
    )
    halves = EngineService.several(halves_settings, "halves", folder / "h", model, 1)[0]
    two = EngineService.several(settings(folder / "two", "2"), "group", folder / "g", model, 2)
    split = await halves.create_lora_training_client(model, rank=8, seed=0)
    ranks = [await s.create_lora_training_client(model, rank=8, seed=s.slot.index) for s in two]
    group = GroupTraining(ranks)
    await group.join(str(folder / "store"), "gloo", 120.0)
    alone_s, _ = await _train(alone, data, 5)
    _, split_norms = await _train(split, data, 5)
    group_s, group_norms = await _train(group, data, 5)
    wa, wh, wg = [await _weights(c, n) for c, n in ((alone, "a"), (split, "h"), (group, "g"))]
    norms = max(abs(g - a) / a for g, a in zip(group_norms, split_norms, strict=True))
    goal = "1e-6 in float32" if DEVICE == "cpu" else "1e-3 of the largest weight, bf16"
    print(f"\n{model}: 5 steps on 8 datums, a group of 2 hosts (4 + 4, gloo), lr 4e-5")
    print(f"  LoRA weights' largest difference from one host with the 8 (goal: {goal}):")
    print(
        f"    cutting them as the group does (4 + 4): {_largest_difference(wh, wg):.2e} "
        f"(gradient norms {norms:.1e} apart, relative)"
    )
    print(f"    in one pass: {_largest_difference(wa, wg):.2e}")
    print(
        f"  one host, 4 + 4 against one pass (its own rounding): {_largest_difference(wa, wh):.2e}"
    )
    print(
        f"  step: one host {statistics.median(alone_s[1:]):.3f} s, "
        f"group {statistics.median(group_s[1:]):.3f} s (median of steps 2-5)"
    )


def all_reduce_time(floats: int, tries: int = 3) -> float:
    """The median seconds of a sum all-reduce of `floats` float32s between 2 gloo ranks (on
    the device: gloo on CUDA tensors, as two hosts sharing a GPU do)."""
    store = Path(tempfile.mkdtemp(prefix="store-")) / "store"
    took: list[float] = []

    def rank(index: int) -> None:
        group = GradientGroup(store, index, 2, "gloo", 120.0)
        buffer = torch.ones(floats, device=DEVICE)
        for _ in range(tries + 1):
            start = time.perf_counter()
            group.sum_(buffer)
            if index == 0:
                took.append(time.perf_counter() - start)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statistics.median(took[1:])


def group_part(models: list[str]) -> None:
    for model in models:
        folder = Path(tempfile.mkdtemp(prefix="group-"))
        try:
            asyncio.run(_group_model(model, folder))
        finally:
            stop_engine_hosts(folder)
            shutil.rmtree(folder, ignore_errors=True)
    floats = 86_000_000
    seconds = all_reduce_time(floats)
    print(
        f"\nsum all-reduce of {floats / 1e6:.0f}M floats between 2 gloo ranks (one process, "
        f"{DEVICE}): "
        f"{seconds:.3f} s ({floats * 4 / seconds / 1e9:.2f} GB/s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="sample,group")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=None, help="default: tiny-random and SmolLM2")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    print(f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {DEVICE}")
    if DEVICE == "cuda":
        print(torch.cuda.get_device_name(0))
    shapes = Path(tempfile.mkdtemp(prefix="shapes-"))
    default = "random-135m" if DEVICE == "cuda" else f"tiny-random,{SMOLLM2}"
    models = [resolve(name, shapes) for name in (args.models or default).split(",")]
    parts = args.parts.split(",")
    if "sample" in parts:
        sample_part(models, args.rounds)
    if "group" in parts:
        group_part(models)


if __name__ == "__main__":
    main()
