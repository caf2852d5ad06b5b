"""Sampler-trainer mismatch: does a bf16 sampler (fused kernel or torch route) learn worse at a
high learning rate than a float32 one? The experiment of notes/mismatch.md section 3 (issue 53).

Three sampler arms over a float32 trainer: `float32`; `bf16 torch` (bf16 copy of the weights,
the adapter's rows added by torch's products: float32 A and B on small products, bf16 above
`packed_group.EXACT_ADAPTER_OUTPUTS`); `bf16 kernel` (the fused C kernel, `lora_rows.c`, A and B
read in bf16). Each part says which route really served (a failed kernel build falls back to
the torch route without a word). Signs: delta = sampler - trainer logprob of a sampled token
(the train/kl_sample_train convention); the ratio is exp(trainer - sampler); k3 is prime-rl's
mismatch_kl, mean(r - 1 - log r) over the ratios r, an estimate of KL(sampler || trainer).

- Part a, numerics on a fixed trajectory: ONE float32 adapter trained by cross-entropy on fixed
  text (Adam, lr 0.02); at steps 0, 5, 20 and 60 its sampler weights are saved once and opened
  in one service per arm, each sampling 4 prompts x 64 tokens (seed 1), scored by the trainer:
  mean and max |delta|, v1 = mean(delta), v2 = 1/2 mean(delta^2), k3, the share of ratios outside
  [0.5, 2] and the largest ratio. Models: tiny-random and SmolLM2-135M (the goals are SmolLM2's).
- Part b, learning in process: benchmarks/stable_loss.py's `run` (tiny-random, 4 prompts x 8 x
  8 tokens, an on-policy sampler, 60 steps) per seed x arm x {is: importance_sampling, reinforce:
  cispo clipped to [1, 1] (no ratio), tis2: cispo clipped to [0, 2] (token TIS at 2)} at lr 2e-2,
  and `is` at lr 5e-3; `--extra-arm JSON` adds importance_sampling with that loss_fn_config.
  Per cell: last-10 reward, its paired difference from float32 by seed, v2, collapses, and
  whether `is` and `tis2` coincide step for step.
- Part c, the learning test's configuration through the real server (benchmarks/learning.py's
  `serving` and `select`), one server per arm (RLCS_SAMPLING_DTYPE, RLCS_CPU_ADAPTER_KERNEL):
  repeat_word, tiny-random, rank 8, group 8 x batch 4, 8 tokens, 60 steps, lr 0.02,
  importance_sampling, seeds 1-4; the test's pass criterion, the last half's reward and the mean
  train/kl_sample_train_v2 from the run's history.
- Part d, D for defaults: learning.py's SmolLM2 repeat_word run (20 steps) through a server at
  its default settings, naming no loss, on seeds 1-4: reward and the gap as a new user sees them.

Run from the repo root on a quiet machine. Durations measured on 2 cores with a test suite
running beside (load average 3-5); a quiet machine should be faster:
    .venv/bin/python -m benchmarks.mismatch --smoke     # every part at toy sizes: about 2 min
    .venv/bin/python -m benchmarks.mismatch --parts a   # tiny-random 11 s, SmolLM2 3-4 min
    .venv/bin/python -m benchmarks.mismatch --parts b --resume /tmp/mismatch-b.jsonl
        # 48 runs of 6-10 s: 6-9 min (one seed 2.2 min; --extra-arm adds 12 runs); runs are
        # deterministic per seed, so a resumed or cut run pairs up with a later one
    .venv/bin/python -m benchmarks.mismatch --parts c   # 12 runs of 60-125 s: 15-25 min
    .venv/bin/python -m benchmarks.mismatch --parts d   # 4 SmolLM2 runs of 20 steps
Options: --models tiny-random,smollm2 (part a), --seeds (parts b and c), --steps (the last
checkpoint of part a, the steps of each run in b and c), --extra-arm '{"rollout_is_threshold": 2}'.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from tinker import types

from benchmarks import learning, stable_loss
from core import loss_config
from core.model_names import SMOLLM2, TINY_RANDOM
from runners.engine.local import LocalSamplingClient, LocalServiceClient
from runners.engine.sample import lora_rows
from runners.engine.sample import scheduler as decode_scheduler
from runners.engine.sample.packed_model import PackedModel
from runners.engine.train.training import LocalTrainingClient

# ----- thresholds, fixed before running (notes/mismatch.md section 3 and section 4) ----------

# A: the kernel's numerics count as the torch route's up to this ratio of mean |delta|...
KERNEL_EQUIVALENT = 1.25
# ...and as dominated by bf16 A and B from this ratio (when it also widens with steps).
KERNEL_DOMINATES = 2.0
# A: "many-fold" growth of a bf16 route's mean |delta| from step 0 to the last step (the notes
# give no number; 3x is this script's reading).
MANY_FOLD = 3.0
# A: acceptance 2: the largest on-policy ratio stays below TIS's cap of 2 (so TIS at 2 is a
# no-op on-policy); the share outside [RATIO_LOW, RATIO_HIGH] is reported beside it.
RATIO_LOW, RATIO_HIGH = 0.5, 2.0
# A: acceptance 1 on SmolLM2 (CPU): a float32 sampler's mean |delta|; a bf16 one's mean and max
# |delta|, |v1| and v2.
FP32_MEAN_GOAL = 1e-4
BF16_MEAN_GOAL, BF16_MAX_GOAL = 0.040, 0.5
BF16_V1_GOAL, BF16_V2_GOAL = 3e-3, 2e-3
# B: "worse" = a paired mean drop in last-10 reward beyond WORSE_DROP with at least
# WORSE_AGREE of the seeds dropping, or at least WORSE_COLLAPSES more collapses.
WORSE_DROP = 0.05
WORSE_AGREE = 0.75
WORSE_COLLAPSES = 2
LAST = 10  # B's last-N reward, and the window of its best N-step mean
COLLAPSE_SHARE = 0.5  # a collapse: the last-10 mean below this share of the best 10-step mean
# C: the learning test's criterion (tests/training/test_training.py `_learns`): the mean reward
# of the second half above FIRST_GAIN_RATIO x the first FIRST_STEPS steps' mean and above it by
# more than MIN_GAIN.
FIRST_STEPS, FIRST_GAIN_RATIO, MIN_GAIN = 5, 2.0, 0.03

CHECKPOINTS = (0, 5, 20, 60)
HIGH_LR_FROM = 20  # A: checkpoints from this step on are "at high LR" (the notes' 20 and 60)
A_LR = 0.02
A_RANK = 8
MODELS = {"tiny-random": TINY_RANDOM, "tiny": TINY_RANDOM, "smollm2": SMOLLM2}
# Part a's fixed cross-entropy data: ordinary text after stable_loss's prompts.
A_TEXT = (
    " The river ran slowly past the old mill, and the children watched the boats go by.",
    " I think the weather will turn cold tonight, so bring a coat and a warm hat.",
    " Then the robot opened the door, looked at the garden and began to count the flowers.",
    " Once upon a time a small fox lived under a hill near a quiet village by the sea.",
)


@dataclass(frozen=True)
class Arm:
    name: str
    sampling_dtype: str
    kernel: bool
    fp32_head: bool = False  # the logits from a float32 unembedding (cast_lm_head_to_fp32)
    sample_offset: int = 0  # part b: added to every sampling seed (the noise floor's arm)


ARMS = (
    Arm("float32", "float32", False),
    Arm("bf16 torch", "bfloat16", False),
    Arm("bf16 kernel", "bfloat16", True),
    Arm("bf16 kernel fp32 head", "bfloat16", True, fp32_head=True),
)
# Part b's noise floor: float32 again, on other samples (every sampling seed moved). Its
# distance from float32 is what sampling noise alone does to a seed's reward.
B_ARMS = (*ARMS, Arm("float32 resampled", "float32", False, sample_offset=1_000_000))


def service(root: Path, arm: Arm, models_dir: Path) -> LocalServiceClient:
    """The arm's local engine: a float32 trainer, the arm's sampler."""
    args = argparse.Namespace(models_dir=str(models_dir), device="cpu")
    return stable_loss.service(
        root / arm.name.replace(" ", "-"), args, arm.sampling_dtype, arm.kernel, arm.fp32_head
    )


def route_of(sampler: LocalSamplingClient) -> str:
    """Which route serves the sampler, read off its decode scheduler's model while it is open
    (the engine's private state: nothing public says whether the kernel really built)."""
    host = sampler._host
    key = host.shared if decode_scheduler.packing_wanted(host) else host
    with decode_scheduler._schedulers_lock:
        found = decode_scheduler._schedulers.get(key)
    model = None if found is None else found._model
    if model is None:
        return "unknown (no decode model yet)"
    dtype = str(getattr(model, "dtype", "?")).removeprefix("torch.")
    if not isinstance(model, PackedModel):
        return f"{dtype}, transformers modules"
    if model.kernel is not None:
        return f"{dtype}, fused kernel"
    return f"{dtype}, torch products"


def route_note(arm: Arm, route: str) -> str:
    """The route, flagged where it is not the one the arm asked for."""
    wanted = "fused kernel" if arm.kernel and arm.sampling_dtype == "bfloat16" else "torch"
    return route if wanted in route else f"{route} (NOT the {wanted} route asked for)"


# ----- part a ---------------------------------------------------------------------------------


@dataclass
class Numerics:
    model: str
    step: int
    arm: str
    route: str
    tokens: int
    mean_abs: float
    max_abs: float
    v1: float  # mean(sampler - trainer)
    v2: float  # 1/2 mean((sampler - trainer)^2)
    k3: float  # mean(r - 1 - log r), r = exp(trainer - sampler)
    outside: float  # share of r outside [RATIO_LOW, RATIO_HIGH]
    max_ratio: float


def token_deltas(
    trainer: LocalTrainingClient,
    sampler: LocalSamplingClient,
    prompts: list[list[int]],
    new_tokens: int,
) -> np.ndarray:
    """Sampler minus trainer logprob of every sampled token: local_backend.exactness's
    measurement (seed 1, one sequence per prompt, temperature 1), kept per token because
    exactness returns only its max, mean |.| and mean."""
    params = types.SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=1, stop=[])
    futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in prompts]
    data, sampled = [], []
    for p, future in zip(prompts, futures, strict=True):
        seq = future.result().sequences[0]
        full = p + list(seq.tokens)
        data.append(supervised(full, [1.0] * (len(full) - 1)))
        sampled.append(np.asarray(seq.logprobs))
    out = trainer.forward(data, "cross_entropy").result().loss_fn_outputs
    return np.concatenate(
        [s - o["logprobs"].to_numpy()[-len(s) :] for s, o in zip(sampled, out, strict=True)]
    )


def numerics(model: str, step: int, arm: Arm, route: str, delta: np.ndarray) -> Numerics:
    log_ratio = -delta  # trainer - sampler
    ratio = np.exp(log_ratio)
    return Numerics(
        model=model,
        step=step,
        arm=arm.name,
        route=route_note(arm, route),
        tokens=int(delta.size),
        mean_abs=float(np.abs(delta).mean()),
        max_abs=float(np.abs(delta).max()),
        v1=float(delta.mean()),
        v2=float(0.5 * np.mean(delta**2)),
        k3=float(np.mean(ratio - 1 - log_ratio)),
        outside=float(np.mean((ratio < RATIO_LOW) | (ratio > RATIO_HIGH))),
        max_ratio=float(ratio.max()),
    )


def ce_data(tokenizer: Any, prompts: list[list[int]]) -> list[types.Datum]:
    """Fixed supervised data: each prompt followed by its text, the text's tokens weighted."""
    data = []
    for prompt, text in zip(prompts, A_TEXT, strict=False):
        full = prompt + tokenizer.encode(text, add_special_tokens=False)
        weights = [0.0] * (len(prompt) - 1) + [1.0] * (len(full) - len(prompt))
        data.append(supervised(full, weights))
    return data


def supervised(tokens: list[int], weights: list[float]) -> types.Datum:
    """A cross-entropy datum predicting tokens[1:] from tokens[:-1] with these weights."""
    # Lists, which the datum converts (its annotation names TensorData only).
    inputs: dict[str, Any] = {"target_tokens": tokens[1:], "weights": weights}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def checkpoints(steps: int) -> list[int]:
    return sorted({s for s in CHECKPOINTS if s < steps} | {steps})


def part_a_model(
    alias: str, steps: int, new_tokens: int, models_dir: Path, root: Path
) -> list[Numerics]:
    """One adapter trained in the float32 arm's service; at each checkpoint its sampler weights
    saved once and opened by every arm's service (identical weights, only numerics differ)."""
    name = MODELS.get(alias, alias)
    services = {arm.name: service(root / alias, arm, models_dir) for arm in ARMS}
    rows: list[Numerics] = []
    kept: list[LocalSamplingClient] = []
    try:
        # A base's last client takes its weights and sampling copy with it: a bare sampler
        # held open in each sampler-only service spares reloading and repacking per checkpoint.
        kept = [
            services[arm.name].create_sampling_client(base_model=name).result() for arm in ARMS[1:]
        ]
        trainer = (
            services[ARMS[0].name].create_lora_training_client(name, rank=A_RANK, seed=0).result()
        )
        tokenizer = trainer.get_tokenizer()
        prompts = [tokenizer.encode(p) for p in stable_loss.PROMPTS]
        data = ce_data(tokenizer, prompts)
        adam = types.AdamParams(learning_rate=A_LR, beta1=0.9, beta2=0.95, eps=1e-8)
        done = 0
        for at in checkpoints(steps):
            for _ in range(at - done):
                trainer.forward_backward(data, "cross_entropy").result()
                trainer.optim_step(adam).result()
            done = at
            path = trainer.save_weights_for_sampler(f"{alias}-step-{at}").result().path
            for arm in ARMS:
                sampler = services[arm.name].create_sampling_client(model_path=path).result()
                try:
                    delta = token_deltas(trainer, sampler, prompts, new_tokens)
                    rows.append(numerics(alias, at, arm, route_of(sampler), delta))
                finally:
                    sampler.close()
                print_numerics_row(rows[-1])
    finally:
        for bare in kept:
            bare.close()
        for engine in services.values():
            engine.close()
    return rows


def print_numerics_row(n: Numerics) -> None:
    print(
        f"  a {n.model} step {n.step:3d} {n.arm:11s} mean|d| {n.mean_abs:.2e} "
        f"max|d| {n.max_abs:.2e} v2 {n.v2:.2e} k3 {n.k3:.2e} ({n.route})",
        flush=True,
    )


def smollm2_goals(n: Numerics) -> str:
    """Acceptance 1 (CPU, SmolLM2) against one row: the marks that fail, or ok."""
    if n.arm == "float32":
        return "ok" if n.mean_abs <= FP32_MEAN_GOAL else f"mean > {FP32_MEAN_GOAL:g}"
    misses = [
        f"mean > {BF16_MEAN_GOAL:g}" if n.mean_abs > BF16_MEAN_GOAL else "",
        f"max > {BF16_MAX_GOAL:g}" if n.max_abs > BF16_MAX_GOAL else "",
        f"|v1| > {BF16_V1_GOAL:g}" if abs(n.v1) > BF16_V1_GOAL else "",
        f"v2 > {BF16_V2_GOAL:g}" if n.v2 > BF16_V2_GOAL else "",
    ]
    return ", ".join(m for m in misses if m) or "ok"


def numerics_table(rows: list[Numerics]) -> str:
    goals = any(r.model == "smollm2" or MODELS.get(r.model) == SMOLLM2 for r in rows)
    head = "| model | step | arm | route | tokens | mean \\|δ\\| | max \\|δ\\| | v1 | v2 | k3 |"
    head += f" r outside [{RATIO_LOW:g}, {RATIO_HIGH:g}] | max r |"
    lines = [head + (" SmolLM2 goals |" if goals else ""), "|---" * (12 + goals) + "|"]
    for n in rows:
        line = (
            f"| {n.model} | {n.step} | {n.arm} | {n.route} | {n.tokens} | {n.mean_abs:.2e} | "
            f"{n.max_abs:.2e} | {n.v1:+.1e} | {n.v2:.1e} | {n.k3:.1e} | {n.outside:.1%} | "
            f"{n.max_ratio:.3f} |"
        )
        if goals:
            line += f" {smollm2_goals(n) if MODELS.get(n.model) == SMOLLM2 else ''} |"
        lines.append(line)
    return "\n".join(lines)


def a_verdict(rows: list[Numerics]) -> list[str]:
    """Part a's outcomes by the notes' table, per model."""
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        by = {(r.arm, r.step): r for r in mine}
        steps = sorted({r.step for r in mine})
        high = [s for s in steps if s >= HIGH_LR_FROM] or steps[-1:]
        ratios = [by["bf16 kernel", s].mean_abs / by["bf16 torch", s].mean_abs for s in high]
        shown = ", ".join(f"step {s} {q:.2f}x" for s, q in zip(high, ratios, strict=True))
        if max(ratios) <= KERNEL_EQUIVALENT:
            kernel = f"kernel cleared (<= {KERNEL_EQUIVALENT}x torch's mean |δ|: {shown}); go by B"
        elif min(ratios) >= KERNEL_DOMINATES and ratios[-1] >= ratios[0]:
            kernel = (
                f"kernel >= {KERNEL_DOMINATES}x torch's and widening ({shown}): bf16 A/B "
                "dominate; read A and B as fp32 in lora_rows.c and re-run A"
            )
        else:
            kernel = (
                f"kernel between {KERNEL_EQUIVALENT}x and {KERNEL_DOMINATES}x torch's "
                f"({shown}): no rule fires"
            )
        growth = {
            arm: by[arm, steps[-1]].mean_abs / max(by[arm, steps[0]].mean_abs, 1e-12)
            for arm in ("bf16 torch", "bf16 kernel")
        }
        grown = ", ".join(f"{a} {g:.1f}x" for a, g in growth.items())
        if min(growth.values()) >= MANY_FOLD:
            grows = f"both bf16 routes grow >= {MANY_FOLD:g}x ({grown}): try fp32 logits first"
        else:
            grows = (
                f"growth step {steps[0]}->{steps[-1]} below {MANY_FOLD:g}x for some route ({grown})"
            )
        top = max(by[a, steps[-1]].max_ratio for a in ("bf16 torch", "bf16 kernel"))
        tis = "holds" if top < RATIO_HIGH else "FAILS"
        lines.append(
            f"a {model}: {kernel}; {grows}; max r at step {steps[-1]} {top:.3f} "
            f"(acceptance 2, < {RATIO_HIGH:g}: {tis})"
        )
        if MODELS.get(model) == SMOLLM2:
            misses = [f"{r.arm} step {r.step}" for r in mine if smollm2_goals(r) != "ok"]
            lines.append(
                f"a {model} goals (mean ≤ {BF16_MEAN_GOAL}, max ≤ {BF16_MAX_GOAL} bf16; fp32 "
                f"mean ≤ {FP32_MEAN_GOAL:g}): "
                + ("all met" if not misses else "missed at " + "; ".join(misses))
            )
    return lines


def part_a(args: argparse.Namespace, root: Path) -> None:
    steps, tokens = (2, 16) if args.smoke else (args.steps, 64)
    print(
        f"\n## Part a: numerics on a fixed trajectory (CE, Adam lr {A_LR}, rank {A_RANK}, "
        f"{len(stable_loss.PROMPTS)} prompts x {tokens} tokens, checkpoints {checkpoints(steps)})",
        flush=True,
    )
    rows: list[Numerics] = []
    for alias in args.models:
        started = time.perf_counter()
        rows += part_a_model(alias, steps, tokens, Path(args.models_dir), root)
        print(f"  a {alias}: {time.perf_counter() - started:.0f} s", flush=True)
    print("\nδ = sampler − trainer logprob; r = exp(trainer − sampler); k3 = mean(r − 1 − log r)\n")
    print(numerics_table(rows))
    print()
    for line in a_verdict(rows):
        print(f"verdict {line}")


# ----- part b ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One loss at one learning rate."""

    label: str
    lr: float
    loss: str
    config: dict[str, float] | None = None


REINFORCE = {"clip_low_threshold": 1.0, "clip_high_threshold": 1.0}
TIS2 = {"clip_low_threshold": 0.0, "clip_high_threshold": 2.0}
HIGH_LR, LOW_LR = 2e-2, 5e-3
DEFAULT_GOAL = 0.05  # issue 53: bf16's reward within this of float32's, each seed, with the default
DEFAULT = dict(loss_config.ROLLOUT_CORRECTION)  # a native run's default: TIS at 2, mask [1/8, 8]
CELLS = tuple(
    cell
    for lr in (HIGH_LR, LOW_LR)
    for cell in (
        Cell("is", lr, "importance_sampling"),
        Cell("reinforce", lr, "cispo", REINFORCE),
        Cell("tis2", lr, "cispo", TIS2),
        Cell("default", lr, "importance_sampling", DEFAULT),
    )
)


@dataclass
class Learned:
    cell: str  # label at lr
    arm: str
    seed: int
    reward: list[float] = field(default_factory=list)
    v2: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def last(self) -> float:
        return statistics.fmean(self.reward[-LAST:])

    @property
    def best(self) -> float:
        n = min(LAST, len(self.reward))
        return max(
            statistics.fmean(self.reward[i : i + n]) for i in range(len(self.reward) - n + 1)
        )

    @property
    def collapsed(self) -> bool:
        return self.last < COLLAPSE_SHARE * self.best


def cell_name(cell: Cell) -> str:
    return f"{cell.label} @ {cell.lr:g}"


def extra_cell(text: str | None) -> Cell | None:
    """`--extra-arm`: importance_sampling with this loss_fn_config at the high LR; refused here,
    with the engine's own words, when the engine does not know its keys."""
    if not text:
        return None
    config = json.loads(text)
    try:
        loss_config.resolve("importance_sampling", config)
    except ValueError as exc:
        raise SystemExit(f"--extra-arm {text}: the engine refuses this config: {exc}") from None
    return Cell("extra", HIGH_LR, "importance_sampling", {k: float(v) for k, v in config.items()})


def b_args(args: argparse.Namespace, lr: float) -> argparse.Namespace:
    """stable_loss's options at their defaults but for the sampler's age (on-policy), the
    steps and the learning rate."""
    b = stable_loss.parser().parse_args([])
    b.model, b.stale, b.steps, b.lr = TINY_RANDOM, 0, args.steps, lr
    b.models_dir, b.device = args.models_dir, "cpu"
    return b


def run_key(cell: Cell, arm: Arm, seed: int, steps: int) -> str:
    return json.dumps([cell.label, cell.lr, cell.loss, cell.config, arm.name, seed, steps])


def load_done(path: Path | None) -> dict[str, Learned]:
    if path is None or not path.exists():
        return {}
    done = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        key = record.pop("key")
        done[key] = Learned(**record)
    return done


def probe_route(engine: LocalServiceClient, arm: Arm) -> str:
    """The route the arm's service samples through, from one short sample."""
    trainer = engine.create_lora_training_client(TINY_RANDOM, rank=8, seed=0).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    try:
        params = types.SamplingParams(max_tokens=2, temperature=1.0, seed=0, stop=[])
        sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, params).result()
        return route_note(arm, route_of(sampler))
    finally:
        sampler.close()
        engine.forget(trainer)


def part_b(args: argparse.Namespace, root: Path) -> None:
    cells = [*CELLS, *filter(None, [extra_cell(args.extra_arm)])]
    if args.b_cells:
        cells = [c for c in cells if cell_name(c) in args.b_cells.split(",")]
    seeds = args.b_seeds
    total = len(seeds) * len(B_ARMS) * len(cells)
    print(
        f"\n## Part b: learning in process (stable_loss.run, tiny-random, 4 prompts x 8 x 8 "
        f"tokens, on-policy, {args.steps} steps, seeds {seeds}; {total} runs)",
        flush=True,
    )
    done = load_done(args.resume)
    runs: dict[tuple[str, str, int], Learned] = {}
    services = {arm.name: service(root, arm, Path(args.models_dir)) for arm in B_ARMS}
    try:
        for arm in B_ARMS:
            print(f"  b route, {arm.name}: {probe_route(services[arm.name], arm)}", flush=True)
        timed = False
        for seed in seeds:  # seed-major: a run cut short leaves whole seeds behind it
            for arm in B_ARMS:
                for cell in cells:
                    key = run_key(cell, arm, seed, args.steps)
                    resumed = key in done
                    if not resumed:
                        done[key] = learn(services[arm.name], cell, arm, seed, args)
                        save_run(args.resume, key, done[key])
                        if not timed:
                            timed = True
                            s = done[key].seconds
                            print(
                                f"  b first run {s:.1f} s: about {s * total / 60:.0f} min for "
                                f"all {total} (cut --seeds if that is too long)",
                                flush=True,
                            )
                    runs[cell_name(cell), arm.name, seed] = done[key]
                    print_learned(done[key], resumed)
    finally:
        for engine in services.values():
            engine.close()
    print()
    print(learning_table(runs, [cell_name(c) for c in cells], seeds))
    print()
    for line in b_verdict(runs, seeds):
        print(f"verdict {line}")


def learn(
    engine: LocalServiceClient, cell: Cell, arm: Arm, seed: int, args: argparse.Namespace
) -> Learned:
    b = b_args(args, cell.lr)
    b.sample_offset = arm.sample_offset
    curve = stable_loss.run(engine, cell.loss, cell.config, seed, b)
    return Learned(cell_name(cell), arm.name, seed, curve.reward, curve.kl, curve.seconds)


def save_run(path: Path | None, key: str, run: Learned) -> None:
    if path is not None:
        with path.open("a") as out:
            out.write(json.dumps({"key": key, **asdict(run)}) + "\n")


def print_learned(r: Learned, resumed: bool = False) -> None:
    half = len(r.v2) // 2
    print(
        "  b (resumed)" if resumed else "  b",
        f"{r.cell:16s} {r.arm:11s} seed {r.seed}: last-{LAST} reward {r.last:.3f} "
        f"(best {r.best:.3f}{', COLLAPSED' if r.collapsed else ''}), v2 2nd half "
        f"{statistics.fmean(r.v2[half:]):.1e} max {max(r.v2):.1e}, {r.seconds:.1f} s",
        flush=True,
    )


def coinciding(a: Learned, b: Learned) -> int:
    """Leading steps where two runs agree: the same reward (the same samples) and v2 to a
    relative 1e-6 (the same ratios)."""
    for i, (ra, rb, ka, kb) in enumerate(zip(a.reward, b.reward, a.v2, b.v2, strict=True)):
        if ra != rb or not math.isclose(ka, kb, rel_tol=1e-6, abs_tol=1e-12):
            return i
    return len(a.reward)


@dataclass
class Compared:
    """One cell's arm against float32 over the seeds."""

    last: float
    diffs: list[float]
    v2_half: float
    v2_max: float
    collapses: int
    extra_collapses: int

    @property
    def worse(self) -> bool:
        dropping = sum(d < 0 for d in self.diffs)
        drop = bool(self.diffs) and statistics.fmean(self.diffs) < -WORSE_DROP
        agree = dropping >= math.ceil(WORSE_AGREE * len(self.diffs))
        return (drop and agree) or self.extra_collapses >= WORSE_COLLAPSES


def compare(
    runs: dict[tuple[str, str, int], Learned], cell: str, arm: str, seeds: list[int]
) -> Compared:
    mine = [runs[cell, arm, s] for s in seeds]
    base = [runs[cell, B_ARMS[0].name, s] for s in seeds]
    half = len(mine[0].v2) // 2
    collapses = sum(r.collapsed for r in mine)
    return Compared(
        last=statistics.fmean(r.last for r in mine),
        diffs=[m.last - b.last for m, b in zip(mine, base, strict=True)],
        v2_half=statistics.fmean(statistics.fmean(r.v2[half:]) for r in mine),
        v2_max=max(max(r.v2) for r in mine),
        collapses=collapses,
        extra_collapses=collapses - sum(r.collapsed for r in base),
    )


def learning_table(
    runs: dict[tuple[str, str, int], Learned], cells: list[str], seeds: list[int]
) -> str:
    lines = [
        f"| loss @ lr | arm | last-{LAST} reward | vs float32: mean [min, max] (seeds lower) | "
        "v2 2nd-half mean | v2 max | collapses | is = tis2 (steps) | worse |",
        "|---|---|---:|---|---:|---:|---:|---|---|",
    ]
    for cell in cells:
        for arm in B_ARMS:
            c = compare(runs, cell, arm.name, seeds)
            paired = "—"
            if arm is not B_ARMS[0]:
                paired = (
                    f"{statistics.fmean(c.diffs):+.3f} [{min(c.diffs):+.3f}, {max(c.diffs):+.3f}] "
                    f"({sum(d < 0 for d in c.diffs)}/{len(c.diffs)})"
                )
            same = ""
            if cell.startswith(("is @", "tis2 @")) and ("tis2 @ " + cell.split(" @ ")[1]) in cells:
                lr = cell.split(" @ ")[1]
                steps = [
                    coinciding(runs[f"is @ {lr}", arm.name, s], runs[f"tis2 @ {lr}", arm.name, s])
                    for s in seeds
                ]
                same = ", ".join(f"{n}/{len(runs[cell, arm.name, seeds[0]].reward)}" for n in steps)
            worse = "" if arm is B_ARMS[0] else ("**yes**" if c.worse else "no")
            lines.append(
                f"| {cell} | {arm.name} | {c.last:.3f} | {paired} | {c.v2_half:.1e} | "
                f"{c.v2_max:.1e} | {c.collapses}/{len(seeds)} | {same} | {worse} |"
            )
    return "\n".join(lines)


def b_verdict(runs: dict[tuple[str, str, int], Learned], seeds: list[int]) -> list[str]:
    """Part b's outcomes by the notes' table."""
    bf16 = [arm.name for arm in ARMS[1:]]

    def worse(cell: str, arm: str) -> bool:
        return compare(runs, cell, arm, seeds).worse

    high = {label: f"{label} @ {HIGH_LR:g}" for label in ("is", "reinforce", "tis2")}
    low_is = f"is @ {LOW_LR:g}"

    def which(cell: str) -> str:
        return "/".join(a for a in bf16 if worse(cell, a)) or "none"

    cells = list(dict.fromkeys(k[0] for k in runs))
    lines = [
        f"b worse (paired mean drop > {WORSE_DROP} with >= {WORSE_AGREE:.0%} of seeds lower, or "
        f">= {WORSE_COLLAPSES} more collapses): "
        + "; ".join(f"{cell}: {which(cell)}" for cell in cells)
    ]
    for lr in (HIGH_LR, LOW_LR):
        if (cell := f"default @ {lr:g}") in cells:
            for arm in [*bf16, B_ARMS[-1].name]:
                diffs = compare(runs, cell, arm, seeds).diffs
                met = all(abs(d) <= DEFAULT_GOAL for d in diffs)
                lines.append(
                    f"b goal {cell}, {arm}: every seed within {DEFAULT_GOAL} of float32 "
                    f"({', '.join(f'{d:+.3f}' for d in diffs)}): {'met' if met else 'NOT met'}"
                )
    if not {*high.values(), low_is} <= set(cells):
        return lines  # a filtered run (--b-cells): the notes' reading needs every cell
    is_worse = {arm: worse(high["is"], arm) for arm in bf16}
    if not any(is_worse.values()):
        lines.append(
            f"b no learning penalty at this scale for either bf16 route with is at {HIGH_LR:g}: "
            "close the question (the test's failures were its own variance)"
        )
        return lines
    if is_worse["bf16 kernel"] and not is_worse["bf16 torch"]:
        lines.append("b only bf16-kernel is worse: the kernel's numerics (check part a agrees)")
    if all(is_worse.values()):
        if not any(worse(high["reinforce"], a) for a in bf16):
            same = all(
                coinciding(runs[high["is"], a, s], runs[high["tis2"], a, s])
                == len(runs[high["is"], a, s].reward)
                for a in bf16
                for s in seeds
            )
            lines.append(
                "b both bf16 arms worse with is, not with reinforce: the ratio channel; "
                + (
                    "tis2 == is: ratios small and noisy, use ratio-free on-policy or fp32 logits"
                    if same
                    else "tis2 differs from is: default TIS is the fix if tis2 recovers"
                )
            )
        elif all(worse(high[c], a) for c in high for a in bf16):
            lines.append("b both bf16 arms worse under all three losses: the behaviour policy")
        if not any(worse(low_is, a) for a in bf16):
            lines.append(f"b worse at {HIGH_LR:g} but not at {LOW_LR:g}: scales with adapter size")
    return lines


# ----- part c ---------------------------------------------------------------------------------


@dataclass
class Served:
    arm: str
    seed: int
    status: str
    reward: list[float]
    v2: list[float]
    seconds: float
    corrected: list[float] = field(default_factory=list)  # mismatch/corrected per step

    @property
    def first(self) -> float:
        return statistics.fmean(self.reward[:FIRST_STEPS]) if self.reward else math.nan

    @property
    def last(self) -> float:
        half = self.reward[len(self.reward) // 2 :]
        return statistics.fmean(half) if half else math.nan

    @property
    def passed(self) -> bool:
        """The test's criterion (rows[30:] of 60 steps is the second half)."""
        return (
            self.status == "succeeded"
            and self.last > FIRST_GAIN_RATIO * self.first
            and self.last - self.first > MIN_GAIN
        )


def c_body(seed: int, steps: int, correction: str) -> dict[str, Any]:
    """`_learns`'s run: TINY_RUN with group 8 x batch 4, lr 0.02. `correction`: the config's
    rollout_correction where the server knows the field ("default": not sent)."""
    body: dict[str, Any] = {
        "environment": "repeat_word",
        "model_name": TINY_RANDOM,
        "lora_rank": 8,
        "max_token_length": 8,
        "use_wandb": False,
        "group_size": 8,
        "batch_size": 4,
        "total_steps": steps,
        "learning_rate": 0.02,
        "seed": seed,
        "save_every": 0,
        "steps_per_eval": 0,
        "loss_fn": "importance_sampling",
    }
    if correction != "default":
        body["rollout_correction"] = correction
    return body


def knows_correction() -> bool:
    from core.training_config import TrainingConfig

    return "rollout_correction" in TrainingConfig.model_fields


def trained_series(
    http: httpx.Client, curve: learning.Curve, body: dict[str, Any], keys: list[str]
) -> dict[str, list[float]]:
    """One run through learning.train, then each of `keys` by step from its history. Its id
    (train keeps it to itself) is the run new in GET /runs."""
    before = {r["run_id"] for r in http.get("/runs").json()}
    learning.train(http, curve, body, 0.1)
    new = [r["run_id"] for r in http.get("/runs").json() if r["run_id"] not in before]
    if not new:
        return {key: [] for key in keys}
    rows = http.get(f"/runs/{new[0]}/history", params={"keys": ",".join(keys)}).json()["rows"]
    rows = sorted(rows, key=lambda r: r["step"])
    return {key: [r[key] for r in rows if key in r] for key in keys}


def serve_one(http: httpx.Client, arm: Arm, seed: int, body: dict[str, Any]) -> Served:
    """One run, its v2 series and the share of tokens corrected, step by step."""
    curve = learning.Curve("repeat_word", "importance_sampling", "grpo")
    v2_key, corrected_key = "train/kl_sample_train_v2", "mismatch/corrected"
    series = trained_series(http, curve, body, [v2_key, corrected_key])
    return Served(
        arm.name, seed, curve.status, curve.reward, series[v2_key], curve.wall_s,
        series[corrected_key],
    )  # fmt: skip


FALLBACK = "fused adapter product is off"  # lora_rows.kernel()'s warning when it falls back


def var_dir_of(http: httpx.Client) -> Path | None:
    """learning.serving's temporary var dir, found by the port its server.log names (serving
    keeps the folder to itself)."""
    for log in Path(tempfile.gettempdir()).glob("rlcs-curves-*/server.log"):
        with contextlib.suppress(OSError):
            if f":{http.base_url.port} " in log.read_text(errors="replace"):
                return log.parent
    return None


def fallback_in_logs(http: httpx.Client) -> str:
    """Whether any log of the server (its engine host's, its runners') says the kernel fell
    back to the torch route; a build that works logs nothing."""
    var = var_dir_of(http)
    if var is None:
        return "server logs not found"
    logs = [p for p in var.rglob("*") if p.is_file() and "log" in p.name]
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if FALLBACK in line:
                return f"FELL BACK: {line.strip()[-160:]}"
    return f"no fallback warning in {len(logs)} log files"


@contextlib.contextmanager
def arm_server(arm: Arm) -> Iterator[httpx.Client]:
    env = {
        "RLCS_SAMPLING_DTYPE": arm.sampling_dtype,
        "RLCS_CPU_ADAPTER_KERNEL": str(arm.kernel).lower(),
        "RLCS_CAST_LM_HEAD_TO_FP32": str(arm.fp32_head).lower(),
    }
    with learning.serving(**env) as http:
        learning.select(http, "repeat_word")
        yield http


def kernel_here() -> str:
    """Whether the kernel builds in this process: the server's engine host builds the same
    source with the same compiler into the same cache (this user's), so it is a proxy for
    the route the server's bf16-kernel arm takes (its logs are not reachable from here)."""
    built = lora_rows.kernel()
    return f"built ({built.path.name})" if built is not None else "NOT built (torch route serves)"


def part_c(args: argparse.Namespace) -> None:
    correction = args.c_correction
    if correction != "default" and not knows_correction():
        correction = "default"  # a server without the field runs Tinker's objective anyway
    seeds = args.c_seeds
    print(
        f"\n## Part c: the learning test's run through the server (repeat_word, tiny-random, "
        f"rank 8, 8 x 4, 8 tokens, {args.steps} steps, lr 0.02, importance_sampling, "
        f"rollout_correction {correction}, seeds {seeds}); kernel in this process: "
        f"{kernel_here()}",
        flush=True,
    )
    runs: list[Served] = []
    for arm in c_arms(args):
        with arm_server(arm) as http:
            for seed in seeds:
                run = serve_one(http, arm, seed, c_body(seed, args.steps, correction))
                runs.append(run)
                print_served(run)
            print(f"  c {arm.name} server logs: {fallback_in_logs(http)}", flush=True)
    print()
    print(served_table(runs))
    print()
    print(f"verdict {c_verdict(runs)}")


def c_arms(args: argparse.Namespace) -> list[Arm]:
    """`--c-arms`: the arms part c serves, by name (default every arm)."""
    wanted = args.c_arms.split(",") if args.c_arms else [arm.name for arm in ARMS]
    unknown = set(wanted) - {arm.name for arm in ARMS}
    if unknown:
        raise SystemExit(f"--c-arms: unknown {sorted(unknown)}; the arms: {[a.name for a in ARMS]}")
    return [arm for arm in ARMS if arm.name in wanted]


def share(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2%}" if values else "—"


def print_served(r: Served) -> None:
    v2 = statistics.fmean(r.v2) if r.v2 else math.nan
    print(
        f"  c {r.arm:11s} seed {r.seed}: {r.status}, {'PASS' if r.passed else 'fail'} "
        f"(first-{FIRST_STEPS} {r.first:.3f}, 2nd half {r.last:.3f}), mean v2 {v2:.1e}, "
        f"tokens corrected {share(r.corrected)}, {r.seconds:.0f} s",
        flush=True,
    )


def served_table(runs: list[Served]) -> str:
    lines = [
        f"| arm | seed | status | test criterion | first-{FIRST_STEPS} reward | 2nd-half reward | "
        "mean v2 | tokens corrected |",
        "|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in runs:
        v2 = statistics.fmean(r.v2) if r.v2 else math.nan
        lines.append(
            f"| {r.arm} | {r.seed} | {r.status} | {'pass' if r.passed else 'FAIL'} | "
            f"{r.first:.3f} | {r.last:.3f} | {v2:.1e} | {share(r.corrected)} |"
        )
    for arm in ARMS:
        mine = [r for r in runs if r.arm == arm.name]
        if not mine:
            continue
        v2s = [statistics.fmean(r.v2) for r in mine if r.v2]
        lines.append(
            f"| **{arm.name}** | all | | {sum(r.passed for r in mine)}/{len(mine)} pass | "
            f"{statistics.fmean(r.first for r in mine):.3f} | "
            f"{statistics.fmean(r.last for r in mine):.3f} | "
            f"{statistics.fmean(v2s) if v2s else math.nan:.1e} | "
            f"{share([c for r in mine for c in r.corrected])} |"
        )
    return "\n".join(lines)


def c_verdict(runs: list[Served]) -> str:
    """Part c ranks the arms; it only corroborates part b (a few seeds decide nothing)."""
    summary = {}
    for arm in ARMS:
        mine = [r for r in runs if r.arm == arm.name]
        if not mine:
            continue
        v2s = [statistics.fmean(r.v2) for r in mine if r.v2]
        summary[arm.name] = (
            statistics.fmean(r.last for r in mine),
            statistics.fmean(v2s) if v2s else math.nan,
        )
    worst = min(summary, key=lambda a: summary[a][0])
    best = max(summary, key=lambda a: summary[a][0])
    higher_v2 = summary[worst][1] > summary[best][1]
    (low, low_v2), (high, high_v2) = summary[worst], summary[best]
    return (
        f"c lowest 2nd-half reward: {worst} ({low:.3f}, v2 {low_v2:.1e}); highest: {best} "
        f"({high:.3f}, v2 {high_v2:.1e}); the worse arm's v2 is "
        f"{'higher' if higher_v2 else 'not higher'}: compare the direction with part b "
        f"(C alone, {len(runs) // len(summary)} seeds per arm, decides nothing)"
    )


# ----- part d ---------------------------------------------------------------------------------

D_STEPS = 20
D_KEYS = ["mismatch/k3", "mismatch/abs_max", "mismatch/corrected"]  # each step's, in this order


def part_d(args: argparse.Namespace) -> None:
    """benchmarks/learning.py's SmolLM2 repeat_word run through a server at its default
    settings, on seeds nobody tuned, naming no loss: whatever a new user's run gets."""
    seeds = args.c_seeds
    steps = D_STEPS if not args.smoke else args.steps
    print(
        f"\n## Part d: SmolLM2 on repeat_word with the server's defaults (learning.py's run: "
        f"group 4 x batch 4, 8 tokens, lr 5e-4, rank 8, {steps} steps, no loss named), seeds "
        f"{seeds}",
        flush=True,
    )
    lines = [
        "| seed | status | reward, steps 1-3 | reward, last 3 | correct, 1-3 | correct, last 3 "
        "| mismatch/k3 mean | abs_max max | tokens corrected |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    with learning.serving() as http:
        learning.select(http, "repeat_word")
        for seed in seeds:
            body = {**learning.COMMON, **learning.PER_ENV["repeat_word"], "seed": seed}
            body["total_steps"] = steps
            curve = learning.Curve("repeat_word", "default", "grpo")
            k3, worst, corrected = trained_series(http, curve, body, D_KEYS).values()
            head, tail = slice(0, 3), slice(-3, None)
            line = (
                f"| {seed} | {curve.status} | {learning.mean_of(curve.reward, head):.3f} | "
                f"{learning.mean_of(curve.reward, tail):.3f} | "
                f"{learning.mean_of(curve.correct, head):.0%} | "
                f"{learning.mean_of(curve.correct, tail):.0%} | "
                f"{statistics.fmean(k3) if k3 else math.nan:.1e} | "
                f"{max(worst) if worst else math.nan:.3f} | {share(corrected)} |"
            )
            print(f"  d {line}", flush=True)
            lines.append(line)
    print()
    print("\n".join(lines))


# ----- main -----------------------------------------------------------------------------------


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--parts", default="a,b,c,d", help="any of a-d, comma-separated")
    parser.add_argument("--models", default=None, help="part a (default tiny-random,smollm2)")
    parser.add_argument("--seeds", default=None, help="parts b and c (default 0-3 and 1-4)")
    parser.add_argument("--steps", type=int, default=None, help="default 60 (smoke: a 2, b/c 6)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: each part in ~1 min")
    parser.add_argument(
        "--extra-arm", default=None, help="part b: importance_sampling with this config (JSON)"
    )
    parser.add_argument(
        "--c-correction",
        choices=("none", "token", "default"),
        default="none",
        help="part c's rollout_correction (none: Tinker's objective, the notes' IS; default: "
        "not sent, the server's default)",
    )
    parser.add_argument("--b-cells", default=None, help='part b\'s cells, e.g. "default @ 0.005"')
    parser.add_argument("--c-arms", default=None, help="part c's arms by name, comma-separated")
    parser.add_argument("--resume", type=Path, default=None, help="part b: runs kept in JSONL")
    parser.add_argument("--models-dir", default="var/models")
    args = parser.parse_args()
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if set(args.parts) - {"a", "b", "c", "d"}:
        parser.error(f"unknown parts {set(args.parts) - {'a', 'b', 'c', 'd'}}")
    smoke = args.smoke
    args.models = (args.models or ("tiny-random" if smoke else "tiny-random,smollm2")).split(",")
    args.b_seeds = [int(s) for s in (args.seeds or ("0" if smoke else "0,1,2,3")).split(",")]
    args.c_seeds = [int(s) for s in (args.seeds or ("1" if smoke else "1,2,3,4")).split(",")]
    if args.steps is None:
        args.steps = 6 if smoke else 60
    return args


def main() -> None:
    args = options()
    extra_cell(args.extra_arm)  # refused before anything runs
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, load average "
        f"{os.getloadavg()[0]:.1f}; parts {args.parts}, steps {args.steps}"
        + (
            " (smoke: the verdicts at these sizes check the wiring, they are no finding)"
            if args.smoke
            else ""
        ),
        flush=True,
    )
    torch.manual_seed(0)
    parts = {"a": part_a, "b": part_b}
    with tempfile.TemporaryDirectory(prefix="rlcs-mismatch-") as tmp:
        for part in args.parts:
            started = time.perf_counter()
            if part in ("c", "d"):
                part_c(args) if part == "c" else part_d(args)
            else:
                parts[part](args, Path(tmp))
            print(
                f"\npart {part}: {time.perf_counter() - started:.0f} s, load average "
                f"{os.getloadavg()[0]:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
