"""stable_reinforce against importance_sampling when the sampler is several steps stale.

The same RL loop, seed and data pipeline twice, changing only the loss: every step samples
with the snapshot taken `--stale` optimizer steps earlier (as an async trainer does), scores a
toy reward (how many of a set of target tokens each sequence contains), builds the datums the
way tinker-cookbook's rl_loop does (provenance spans included) and takes one step. It prints,
side by side and averaged over the seeds, each step's reward, how far the learner has moved
from the sampler that produced the batch (KL on the sampled tokens) and the gradient norm;
then the stability measures and their ratios. Local engine, CPU by default.

Run from the repo root:
    .venv/bin/python -m benchmarks.stable_loss [--model tiny-random] [--steps 60] [--stale 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tinker import types

from core.model_names import SMOLLM2, TINY_RANDOM
from runners.engine.local import LocalSamplingClient, LocalServiceClient
from tests.support.cookbook_datums import rl_datum

ALIASES = {"tiny-random": TINY_RANDOM, "tiny": TINY_RANDOM, "smollm2": SMOLLM2}
PROMPTS = ("Write anything:", "Say something.", "Go on:", "Tell me a story:")


@dataclass
class Curve:
    loss: str
    reward: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)  # 1/2 mean of (log q - log p)^2, sampled
    grad_norm: list[float] = field(default_factory=list)
    masked: list[float] = field(default_factory=list)  # share of sampled tokens masked
    seconds: float = 0.0


def target_tokens(
    sampler: LocalSamplingClient, prompts: list[list[int]], args: argparse.Namespace
) -> set[int]:
    """The reward's tokens: those the start policy samples 6th to (5 + count)th most often after
    the prompts, so the reward starts low but each of them is met now and then."""
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=7, stop=[])
    counts: dict[int, int] = {}
    for p in prompts:
        response = sampler.sample(types.ModelInput.from_ints(p), 64, params).result()
        for seq in response.sequences:
            for token in seq.tokens:
                counts[token] = counts.get(token, 0) + 1
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    return set(ranked[5 : 5 + args.targets])


def score(tokens: list[int], targets: set[int], kind: str) -> float:
    """`share`: the share of sampled tokens in the target set (collapsing onto one target token
    scores 1). `distinct`: the share of the target set sampled at least once (it takes
    variety: one token repeated scores 1/len(targets))."""
    if kind == "share":
        return sum(t in targets for t in tokens) / len(tokens)
    return len(targets.intersection(tokens)) / len(targets)


def run(
    service: LocalServiceClient,
    loss: str,
    config: dict[str, float] | None,
    seed: int,
    args: argparse.Namespace,
) -> Curve:
    trainer = service.create_lora_training_client(args.model, rank=args.rank, seed=seed).result()
    tokenizer = trainer.get_tokenizer()
    prompts = [tokenizer.encode(p) for p in PROMPTS[: args.prompts]]
    first = trainer.save_weights_and_get_sampling_client().result()
    targets = target_tokens(first, prompts, args)
    first.close()
    adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95, eps=1e-8)
    samplers: deque[LocalSamplingClient] = deque()
    curve = Curve(loss)
    start = time.perf_counter()
    for step in range(args.steps):
        samplers.append(
            trainer.save_weights_and_get_sampling_client(record_stability_info=True).result()
        )
        while len(samplers) > args.stale + 1:
            samplers.popleft().close()
        sampler = samplers[0]  # the snapshot `stale` steps old (or the first one)
        params = types.SamplingParams(
            max_tokens=args.max_tokens,
            temperature=1.0,
            seed=1000 * seed + step + args.sample_offset,
            stop=[],
        )
        futures = [
            sampler.sample(types.ModelInput.from_ints(p), args.group, params) for p in prompts
        ]
        data, rewards, sampled = [], [], []
        for p, future in zip(prompts, futures, strict=True):
            sequences = future.result().sequences
            group = [score(s.tokens, targets, args.reward) for s in sequences]
            mean = statistics.fmean(group)
            rewards += group
            for seq, reward in zip(sequences, group, strict=True):
                data.append(rl_datum(p, seq, reward - mean))
                sampled.append((len(p) - 1, np.asarray(seq.logprobs)))
        out = trainer.forward_backward(data, loss, config).result()
        norm = trainer.optim_step(adam).result().metrics["grad_norm"]
        gaps = np.concatenate(
            [
                q - o["logprobs"].to_numpy()[ob:]
                for (ob, q), o in zip(sampled, out.loss_fn_outputs, strict=True)
            ]
        )
        curve.reward.append(statistics.fmean(rewards))
        # The cookbook's optim/kl_sample_train_v2: half the mean squared log-ratio.
        curve.kl.append(float(0.5 * np.mean(gaps**2)))
        curve.grad_norm.append(norm)
        tokens = out.metrics.get("sampled_tokens:sum")
        curve.masked.append(out.metrics["masked_tokens:sum"] / tokens if tokens else 0.0)
    curve.seconds = time.perf_counter() - start
    for sampler in samplers:
        sampler.close()
    service.forget(trainer)
    return curve


def summary(curves: list[Curve]) -> dict[str, float]:
    """Stability measures, each averaged over the seeds' runs."""
    half = len(curves[0].reward) // 2

    def mean(measure: Callable[[Curve], float]) -> float:
        return statistics.fmean(measure(c) for c in curves)

    return {
        "reward, last 10 steps": mean(lambda c: statistics.fmean(c.reward[-10:])),
        "best 10-step reward": mean(
            lambda c: max(statistics.fmean(c.reward[i : i + 10]) for i in range(len(c.reward) - 9))
        ),
        "KL, mean of 2nd half": mean(lambda c: statistics.fmean(c.kl[half:])),
        "KL, max": mean(lambda c: max(c.kl)),
        "steps with KL > 1": mean(lambda c: sum(k > 1 for k in c.kl)),
        "grad norm, max": mean(lambda c: max(c.grad_norm)),
    }


def averaged(curves: list[Curve], name: str) -> list[float]:
    series = [getattr(c, name) for c in curves]
    return [statistics.fmean(values) for values in zip(*series, strict=True)]


def service(
    root: Path,
    args: argparse.Namespace,
    sampling_dtype: str = "float32",
    cpu_adapter_kernel: bool = True,
    cast_lm_head_to_fp32: bool = False,
) -> LocalServiceClient:
    """The local engine `run` trains on, checkpoints under `root`: a float32 trainer and, by
    default, a float32 sampler (so sampler and trainer logprobs agree to float32 rounding);
    `sampling_dtype`, `cpu_adapter_kernel` and `cast_lm_head_to_fp32` as LocalServiceClient
    takes them (other benchmarks compare samplers: benchmarks/mismatch.py)."""
    return LocalServiceClient(
        checkpoint_dir=root / "checkpoints",
        models_dir=Path(args.models_dir),
        device=args.device,
        dtype="float32",
        sampling_dtype=sampling_dtype,
        cpu_adapter_kernel=cpu_adapter_kernel,
        cast_lm_head_to_fp32=cast_lm_head_to_fp32,
    )


def parser() -> argparse.ArgumentParser:
    """The options `run` reads (with their defaults: `parser().parse_args([])`)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--stale", type=int, default=4, help="sampler age in optimizer steps")
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--targets", type=int, default=8, help="size of the rewarded token set")
    parser.add_argument("--reward", choices=("distinct", "share"), default="distinct")
    parser.add_argument("--seeds", default="0,1,2,3", help="one run per loss and seed")
    parser.add_argument(
        "--sample-offset", type=int, default=0, help="added to every sampling seed (resampled runs)"
    )
    parser.add_argument("--stable-config", default="{}", help="stable_reinforce's config, JSON")
    parser.add_argument("--models-dir", default="var/models")
    parser.add_argument("--device", default="cpu")
    return parser


def main() -> None:
    args = parser().parse_args()
    args.model = ALIASES.get(args.model, args.model)
    seeds = [int(s) for s in args.seeds.split(",")]
    stable_config = json.loads(args.stable_config) or None
    torch.manual_seed(0)

    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"load average {os.getloadavg()[0]:.1f}; {args.model}, sampler {args.stale} steps "
        f"stale, lr {args.lr}, {args.prompts} prompts x {args.group} samples x "
        f"{args.max_tokens} tokens, reward {args.reward}, {args.steps} steps, seeds {seeds}, "
        f"stable_reinforce config {stable_config or 'default'}"
    )
    runs: dict[str, list[Curve]] = {"importance_sampling": [], "stable_reinforce": []}
    with tempfile.TemporaryDirectory() as tmp:
        with service(Path(tmp), args) as engine:
            for seed in seeds:
                runs["importance_sampling"].append(
                    run(engine, "importance_sampling", None, seed, args)
                )
                runs["stable_reinforce"].append(
                    run(engine, "stable_reinforce", stable_config, seed, args)
                )
    base, stable = runs["importance_sampling"], runs["stable_reinforce"]
    print(f"\nMeans over the {len(seeds)} seeds, step by step (KL: the sampler's to the learner's)")
    print("     | importance_sampling    | stable_reinforce")
    print("step | reward     KL    grad | reward     KL    grad  masked")
    columns = [averaged(c, n) for c in (base, stable) for n in ("reward", "kl", "grad_norm")]
    masked = averaged(stable, "masked")
    for i in range(args.steps):
        b_r, b_k, b_g, s_r, s_k, s_g = (col[i] for col in columns)
        print(
            f"{i + 1:4d} | {b_r:6.3f} {b_k:6.3f} {b_g:7.1f} |"
            f" {s_r:6.3f} {s_k:6.3f} {s_g:7.1f}  {masked[i]:6.1%}"
        )
    print()
    print(
        f"{'measure (mean over seeds)':26s} {'importance_sampling':>20s} {'stable_reinforce':>17s}"
    )
    for (name, b), s in zip(summary(base).items(), summary(stable).values(), strict=True):
        ratio = f"{s / b:7.2f}x" if b else ""
        print(f"{name:26s} {b:20.3f} {s:17.3f} {ratio}")
    seconds = [sum(c.seconds for c in curves) for curves in (base, stable)]
    print(f"{'seconds, all seeds':26s} {seconds[0]:20.1f} {seconds[1]:17.1f}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
