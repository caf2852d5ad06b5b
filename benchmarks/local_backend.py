"""Local backend throughput: our sampling engine, with an adapter (as runs sample) and on the
base model (as /v1 and test inference of a base model do), against the strongest plain route,
transformers' batched `generate` on the base model (the faster of float32 and bfloat16 on the
CPU, compiled with a static cache on CUDA), every row decoding exactly the same number of
tokens, per decode step and overall; training tokens per second; and one RL step of the
backend (sample, train, refresh the sampler). On a GPU also the ceilings measured in the same
run (copy bandwidth, bf16 matrix rate), each decode step's memory floor and the training's
share of the matrix rate; `--e2e-steps` adds a real run through the server on the same model.

Run from the repo root:
    .venv/bin/python -m benchmarks.local_backend --models tiny-random,smollm2
On a GPU, random-initialised shapes need no download: --models random-135m (one per run)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tinker import types

from benchmarks import gpu
from benchmarks.rl_data import importance_data
from core.model_names import SMOLLM2, TINY_RANDOM
from runners.engine.local import LocalSamplingClient, LocalServiceClient, LocalTrainingClient
from runners.engine.padding import left_pad
from runners.engine.sample import scheduler
from runners.engine.sample.packed_model import PackedModel
from runners.models import loading

ALIASES = {"tiny-random": TINY_RANDOM, "tiny": TINY_RANDOM, "smollm2": SMOLLM2}
# Shapes of real models, built with random weights (speed does not depend on the values).
RANDOM_SHAPES = {
    "random-135m": dict(  # SmolLM2-135M
        model_type="llama",
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    "random-1.5b": dict(  # Qwen2-1.5B
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    "random-7b": dict(  # Qwen2.5-7B
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
    ),
}


def build_random(alias: str, folder: Path) -> str:
    """Save a random-initialised model of a known shape (and a byte-level tokenizer)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from runners.models.tiny import build_tiny_tokenizer

    shape = dict(RANDOM_SHAPES[alias])
    config = AutoConfig.for_model(shape.pop("model_type"), **shape)
    torch.manual_seed(0)
    # Initialised on the GPU where there is one (a 7B model takes minutes on a CPU).
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    path = folder / alias
    model.save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return str(path)


def random_prompts(count: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(32, 49, (count,), generator=generator)
    return [torch.randint(100, vocab, (int(n),), generator=generator).tolist() for n in lengths]


QUESTIONS = [
    "What is 7 times 8?",
    "Name a primary colour.",
    "Write a haiku about the sea.",
    "Why is the sky blue? Answer in one sentence.",
    "List three fruits.",
    "What is the capital of Japan?",
    "Translate 'good morning' into French.",
    "Give me a word that rhymes with cat.",
    "How many legs does a spider have?",
    "Explain what a prime number is to a child.",
    "What is the boiling point of water in Celsius?",
    "Suggest a name for a pet turtle.",
    "What comes after Tuesday?",
    "Summarise the plot of Cinderella in a sentence.",
    "Is a tomato a fruit or a vegetable?",
    "Count from one to five in Spanish.",
]


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    prompts = []
    for i in range(count):
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


def time_batched(sampler: LocalSamplingClient, prompts: list[list[int]], new_tokens: int) -> float:
    """All prompts sampled by concurrent callers (one asyncio task each), as the loop does;
    every row decodes exactly `new_tokens` (end-of-sequence ignored)."""
    params = [
        types.SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=i)
        for i in range(len(prompts))
    ]

    async def run() -> list[types.SampleResponse]:
        return await asyncio.gather(
            *(
                sampler.sample(types.ModelInput.from_ints(p), 1, params[i], ignore_eos=True)
                for i, p in enumerate(prompts)
            )
        )

    started = time.perf_counter()
    responses = asyncio.run(run())
    elapsed = time.perf_counter() - started
    assert all(len(r.sequences[0].tokens) == new_tokens for r in responses)
    return elapsed


def generate_exactly(
    model, ids: torch.Tensor, mask: torch.Tensor, new: int, pad_id: int, static: bool = False
) -> None:
    """transformers' generate, sampling at temperature 1, forced to exactly `new` tokens
    (`static`: a static cache, which generate compiles with CUDA graphs)."""
    extra = {"cache_implementation": "static"} if static else {}
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=pad_id,
            **extra,
        )
    assert out.shape[1] - ids.shape[1] == new


def time_generate_batched(
    model, prompts: list[list[int]], new_tokens: int, pad_id: int, static: bool = False
) -> float:
    """generate on all prompts as one left-padded batch (dynamic or static KV cache)."""
    ids, mask = left_pad(prompts, pad_id)
    sync()
    started = time.perf_counter()
    generate_exactly(model, ids, mask, new_tokens, pad_id, static)
    sync()
    return time.perf_counter() - started


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_step(routes: dict[str, Callable[[int], float]], new_tokens: int, rounds: int) -> dict:
    """Each route's best seconds for `new_tokens`, ms per decode step ((t(new) - t(1)) /
    (new - 1), best of each), and peak GiB; the routes take turns, `rounds` times, so a
    change in the machine's load falls on all of them alike."""
    full: dict[str, list[float]] = {label: [] for label in routes}
    one: dict[str, list[float]] = {label: [] for label in routes}
    peak: dict[str, float] = dict.fromkeys(routes, 0.0)
    for _ in range(rounds):
        for label, timer in routes.items():
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            full[label].append(timer(new_tokens))
            if torch.cuda.is_available():
                peak[label] = max(peak[label], torch.cuda.max_memory_allocated() / 2**30)
            one[label].append(timer(1))
    return {
        label: (
            min(full[label]),
            (min(full[label]) - min(one[label])) / (new_tokens - 1) * 1e3,
            peak[label],
        )
        for label in routes
    }


def time_generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int) -> float:
    """generate, one prompt at a time."""
    started = time.perf_counter()
    for p in prompts:
        ids = torch.tensor([p])
        generate_exactly(model, ids, torch.ones_like(ids), new_tokens, pad_id)
    return time.perf_counter() - started


def training_data(trainer: LocalTrainingClient, prompts: list[list[int]], new_tokens: int):
    """Cross-entropy datums: each prompt followed by `new_tokens` filler tokens."""
    tokenizer = trainer.get_tokenizer()
    filler = tokenizer.encode(" the quick brown fox jumps over the lazy dog" * 20)
    data = []
    for p in prompts:
        seq = p + filler[:new_tokens]
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(seq[:-1]),
                loss_fn_inputs={"target_tokens": seq[1:], "weights": [1.0] * (len(seq) - 1)},
            )
        )
    return data


def time_training(
    trainer: LocalTrainingClient, prompts: list[list[int]], new_tokens: int, repeats: int
) -> tuple[float, float, int]:
    """Seconds per forward_backward and per forward_backward + optim_step, and tokens per call."""
    data = training_data(trainer, prompts, new_tokens)
    tokens = sum(d.model_input.length for d in data)
    adam = types.AdamParams(learning_rate=1e-4)
    trainer.forward_backward(data, "cross_entropy").result()  # warm-up
    trainer.optim_step(adam).result()
    started = time.perf_counter()
    for _ in range(repeats):
        trainer.forward_backward(data, "cross_entropy").result()
    fb = (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        trainer.forward_backward(data, "cross_entropy")
        trainer.optim_step(adam).result()
    step = (time.perf_counter() - started) / repeats
    return fb, step, tokens


def time_training_memory(
    trainer: LocalTrainingClient, prompts: list[list[int]], new_tokens: int, repeats: int
) -> tuple[float, float, int, float, float] | None:
    """time_training, with the CUDA memory allocated before it and its peak (GiB; zeros off
    CUDA); None when the budget runs out of GPU memory."""
    cuda = torch.cuda.is_available()
    if cuda:
        free_gpu()
        torch.cuda.reset_peak_memory_stats()
    held = torch.cuda.memory_allocated() / 2**30 if cuda else 0.0
    try:
        fb, step, tokens = time_training(trainer, prompts, new_tokens, repeats)
    except torch.OutOfMemoryError:
        trainer.optim_step(types.AdamParams(learning_rate=0.0)).result()  # drop the gradients
        free_gpu()
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    return fb, step, tokens, held, peak


def time_rl_step(trainer, prompts: list[list[int]], episodes: int, new_tokens: int) -> float:
    """One RL step on the backend alone: sample `episodes` (groups of 16 over the prompts),
    importance-sampling forward_backward, optim_step, and a fresh sampler on the new weights."""
    sampler = trainer.save_weights_and_get_sampling_client().result()
    group_prompts = [prompts[g % len(prompts)] for g in range(max(1, episodes // 16))]
    params = types.SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=0, stop=[])
    started = time.perf_counter()

    async def sample_all() -> list[types.SampleResponse]:
        calls = [sampler.sample(types.ModelInput.from_ints(p), 16, params) for p in group_prompts]
        return await asyncio.gather(*calls)

    data = importance_data(group_prompts, asyncio.run(sample_all()))
    trainer.forward_backward(data, "importance_sampling")
    trainer.optim_step(types.AdamParams(learning_rate=1e-5)).result()
    trainer.save_weights_and_get_sampling_client().result()
    return time.perf_counter() - started


def exactness(trainer, sampler, prompts: list[list[int]], new_tokens: int) -> tuple[float, ...]:
    """Sampler logprobs against the trainer's for the same tokens: max and mean |difference|,
    and the mean of (sampler - trainer), what train/kl_sample_train estimates."""
    params = types.SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=1, stop=[])
    data, sampled = [], []
    for p in prompts:
        seq = sampler.sample(types.ModelInput.from_ints(p), 1, params).result().sequences[0]
        full = p + list(seq.tokens)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)},
            )
        )
        sampled.append(np.asarray(seq.logprobs))
    out = trainer.forward(data, "cross_entropy").result().loss_fn_outputs
    diffs = np.concatenate(
        [s - o["logprobs"].to_numpy()[-len(s) :] for s, o in zip(sampled, out, strict=True)]
    )
    return float(np.abs(diffs).max()), float(np.abs(diffs).mean()), float(diffs.mean())


PLAIN_ROUTES = ("generate, plain", "generate, static")


def plain_baselines(name: str, args: argparse.Namespace, service: LocalServiceClient) -> dict:
    """The strongest plain routes, `generate` on the base model alone (no adapter, no peft:
    less work than sampling through an adapter), by label: on CUDA compiled with a static
    cache (--static), in the service's dtype; on the CPU in float32 and in bfloat16, since
    which of the two is faster depends on the CPU and the batch."""
    models_dir = Path(args.models_dir)
    routes: dict[str, tuple[object, bool]] = {}
    if torch.device(service.device).type == "cuda":
        if args.static:
            model, _ = loading.load_model_and_tokenizer(name, models_dir, service.device, "auto")
            routes["generate, static cache compiled"] = (model, True)
        return routes
    for dtype in ("float32", "bfloat16"):
        model, _ = loading.load_model_and_tokenizer(name, models_dir, service.device, dtype)
        routes[f"generate, plain {dtype}"] = (model, False)
    return routes


def bench_model(alias: str, args: argparse.Namespace, ceilings: gpu.Ceilings | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        randomised = alias in RANDOM_SHAPES
        name = build_random(alias, Path(tmp)) if randomised else ALIASES.get(alias, alias)
        service = LocalServiceClient(
            checkpoint_dir=Path(tmp) / "checkpoints",
            models_dir=Path(args.models_dir),
            device=args.device,
            sampling_dtype=args.sampling_dtype,
        )
        try:
            measure_backend(alias, name, service, args, ceilings)
        finally:
            service.close()
        if args.e2e_steps:
            free_gpu()
            from benchmarks.learning import end_to_end

            print(f"\nend to end through the server ({alias}, {args.e2e_steps} steps):")
            end_to_end(args.e2e_steps, model_name=name)


def free_gpu() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure_backend(
    alias: str,
    name: str,
    service: LocalServiceClient,
    args: argparse.Namespace,
    ceilings: gpu.Ceilings | None,
) -> None:
    randomised = alias in RANDOM_SHAPES
    started = time.perf_counter()
    trainer = service.create_lora_training_client(name, rank=args.rank, seed=0).result()
    load_s = time.perf_counter() - started
    sampler = trainer.save_weights_and_get_sampling_client().result()
    model = trainer._host.model  # the peft model the trainer uses
    tokenizer = trainer.get_tokenizer()
    pad = int(tokenizer.pad_token_id or 0)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    params = sum(p.numel() for p in model.parameters())
    print(
        f"\n## {alias}  ({params / 1e6:.0f}M parameters, load {load_s:.1f} s, "
        f"LoRA rank {args.rank}, device {service.device}, sampling dtype {args.sampling_dtype})"
    )
    base_sampler = service.create_sampling_client(base_model=name).result()
    baselines = plain_baselines(name, args, service)
    new = args.new_tokens
    counts = [int(c) for c in args.prompts.split(",")]
    static_counts = {int(c) for c in (args.static_prompts or args.prompts).split(",")}
    for count in counts:
        prompts = random_prompts(count, vocab) if randomised else chat_prompts(tokenizer, count)
        routes = {
            f"ours, rank-{args.rank} adapter": lambda k, p=prompts: time_batched(sampler, p, k),
            "ours, base model": lambda k, p=prompts: time_batched(base_sampler, p, k),
        }
        for label, (plain, static) in baselines.items():
            if static and count not in static_counts:
                continue
            routes[label] = lambda k, p=prompts, m=plain, st=static: time_generate_batched(
                m, p, k, pad, static=st
            )
        if args.peft_generate:
            routes["generate, peft adapter"] = lambda k, p=prompts: time_generate_batched(
                model, p, k, pad
            )
        warm = {}
        for label, timer in routes.items():
            started = time.perf_counter()
            timer(new)  # warm-up (captures graphs; compiles, for the static route)
            warm[label] = time.perf_counter() - started
        timed = per_step(routes, new, args.repeats)
        figures = {}
        for label, (seconds, ms, peak) in timed.items():
            plain = baselines.get(label, (None, False))[0]
            if "static" in label and getattr(plain, "_compiled_call", None) is None:
                label += " (NOT compiled)"  # generate compiles on CUDA only
            figures[label] = (seconds, ms, peak, warm[label.removesuffix(" (NOT compiled)")])
        if args.one_at_a_time:
            nan = float("nan")
            figures["generate, one at a time"] = (
                time_generate(model, prompts, new, pad),
                nan,
                nan,
                nan,
            )
        print_sampling(count, new, prompts, figures)
        if ceilings is not None:
            print_floor(trainer, count, prompts, new, figures, ceilings)
        if args.profile and ceilings is not None and count == max(counts):
            gpu.profile(
                lambda p=prompts: time_batched(sampler, p, 16),
                f"ours, {count} rows x 16 tokens",
                None,
            )
    base_sampler.close()
    if args.sampling_only:
        return
    baselines.clear()  # their memory goes back before training
    free_gpu()
    train_prompts = (
        random_prompts(args.train_sequences, vocab)
        if randomised
        else (chat_prompts(tokenizer, args.train_sequences))
    )
    # The service's default for this device and shape (microbatch_budget.py) is always timed.
    default_budget = trainer._tokens_per_microbatch
    budgets = [int(b) for b in args.tokens_per_microbatch.split(",") if b]
    trained: dict[int, tuple[float, float, int, float, float] | None] = {}
    for budget in sorted({*budgets, default_budget}):
        trainer._tokens_per_microbatch = budget
        trained[budget] = time_training_memory(trainer, train_prompts, new, args.repeats)
    trainer._tokens_per_microbatch = default_budget  # the profile and the RL step use it
    if args.profile and ceilings is not None:
        data = training_data(trainer, train_prompts, new)
        gpu.profile(
            lambda: trainer.forward_backward(data, "cross_entropy").result(),
            f"forward_backward, {len(data)} sequences",
            None,
        )
        trainer.optim_step(types.AdamParams(learning_rate=1e-4)).result()
    prompts = random_prompts(16, vocab) if randomised else chat_prompts(tokenizer, 16)
    agree = exactness(
        trainer, trainer.save_weights_and_get_sampling_client().result(), prompts[:8], new
    )
    time_rl_step(trainer, prompts, args.episodes, args.episode_tokens)  # warm-up
    rl = sorted(
        time_rl_step(trainer, prompts, args.episodes, args.episode_tokens)
        for _ in range(args.repeats)
    )[args.repeats // 2]
    if args.profile and ceilings is not None:
        gpu.profile(
            lambda: time_rl_step(trainer, prompts, args.episodes, args.episode_tokens),
            f"RL step, {args.episodes} x {args.episode_tokens}",
            None,
        )
    for budget, figures in trained.items():
        which = " (the default here)" if budget == default_budget else ""
        print(
            f"training: {args.train_sequences} sequences, "
            f"micro-batches of up to {budget} tokens{which}"
        )
        if figures is None:
            print("  out of GPU memory")
            continue
        fb, step, train_tokens, held, peak = figures
        print(f"  {train_tokens} tokens per call")
        print(f"  forward_backward               {fb:8.2f} s  {train_tokens / fb:9.1f} tok/s")
        print(f"  forward_backward + optim_step  {step:8.2f} s  {train_tokens / step:9.1f} tok/s")
        if torch.cuda.is_available():
            print(
                f"  peak CUDA memory allocated {peak:.2f} GiB ({peak - held:.2f} GiB above the "
                f"{held:.2f} GiB held before)"
            )
        if ceilings is not None:
            print_training_share(trainer, train_tokens / fb, ceilings)
    print(
        f"sampler vs trainer logprobs (8 x {args.new_tokens} tokens, after training): "
        f"max |diff| {agree[0]:.2e}, mean |diff| {agree[1]:.2e}, mean diff {agree[2]:+.2e}"
    )
    print(
        f"RL step on the backend ({args.episodes} episodes x {args.episode_tokens} tokens: "
        f"sample, forward_backward, optim_step, new sampler): {rl:.2f} s (median)"
    )


def print_floor(trainer, count, prompts, new, figures, ceilings: gpu.Ceilings) -> None:
    """Each route's ms per step against the memory floor: the sampler's weights (base and
    adapter) and the mean cached context read once per step at the measured bandwidth."""
    sampling = scheduler.scheduler_for(trainer._host)._sampling_model()
    weights = (
        sampling.nbytes()
        if isinstance(sampling, PackedModel)
        else gpu.module_bytes(sampling.module)
    )
    context = sum(len(p) for p in prompts) / count + new / 2
    kv = int(count * context * gpu.kv_bytes_per_token(trainer._host.model.config))
    floor = gpu.decode_floor_ms(weights, kv, ceilings.copy_bytes_per_s)
    print(
        f"  memory floor {floor:.3f} ms/step (weights {weights / 2**20:.0f} MiB + KV "
        f"{kv / 2**20:.0f} MiB at {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s): "
        + ", ".join(f"{label} {ms / floor:.0f}x" for label, (_, ms, *_rest) in figures.items())
    )


def print_training_share(trainer, tokens_per_s: float, ceilings: gpu.Ceilings) -> None:
    """The training's arithmetic against the measured bf16 matrix rate. A LoRA step needs
    about 4 x params FLOPs per token (forward, and backward through the activations: the
    frozen base gets no weight gradients); 6 x params is the usual full-training count."""
    params = sum(p.numel() for p in trainer._host.model.parameters())
    for factor, what in ((4, "needed by a LoRA step"), (6, "full-training convention")):
        share = factor * params * tokens_per_s / ceilings.bf16_flops
        print(
            f"  share of the measured bf16 rate ({ceilings.bf16_flops / 1e12:.0f} TFLOP/s), "
            f"{factor} x params x tok/s ({what}): {share:.1%}"
        )


def print_sampling(count: int, new: int, prompts: list[list[int]], figures: dict) -> None:
    """The routes' figures, and how many times faster each of ours is than the fastest
    `generate` route (by whole-call time and by decode step)."""
    plen = sum(len(p) for p in prompts) / count
    total = count * new
    plain = {k: v for k, v in figures.items() if k.startswith(PLAIN_ROUTES)}
    best_s = min((v[0] for v in plain.values()), default=float("nan"))
    best_ms = min((v[1] for v in plain.values()), default=float("nan"))
    print(f"sampling: {count} prompts (mean {plen:.0f} tokens) x {new} new tokens")
    print(
        f"  {'route':36} {'total s':>8} {'tok/s':>9} {'ms/step':>8} {'peak GiB':>8} "
        f"{'x fastest generate':>19} {'per step':>9} {'first call s':>12}"
    )
    for label, (seconds, ms, peak, warm) in figures.items():
        print(
            f"  {label:36} {seconds:8.2f} {total / seconds:9.1f} {ms:8.2f} {peak:8.2f} "
            f"{best_s / seconds:18.2f}x {best_ms / ms:8.2f}x {warm:12.1f}"
        )


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-random,smollm2")
    parser.add_argument("--prompts", default="16", help="comma-separated batch sizes")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds of each timing (the best counts)"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch's intra-op threads for every route (0: torch's default, one per core)",
    )
    parser.add_argument("--sampling-dtype", default="auto")
    parser.add_argument("--models-dir", default="var/models")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--episode-tokens", type=int, default=64)
    parser.add_argument("--train-sequences", type=int, default=16)
    parser.add_argument(
        "--tokens-per-microbatch",
        default="4096",
        help="comma-separated training micro-batch budgets; the service's default for the "
        "device and model (4096 on the CPU) is timed too ('': the default alone)",
    )
    parser.add_argument(
        "--static",
        action=argparse.BooleanOptionalAction,
        default=cuda,
        help="also time generate with a static cache, compiled, on the plain model "
        "(default on CUDA)",
    )
    parser.add_argument(
        "--static-prompts", default=None, help="batch sizes for the static route (default: all)"
    )
    parser.add_argument(
        "--peft-generate",
        action="store_true",
        help="also time generate on the trainer's peft model (the adapter through peft)",
    )
    parser.add_argument(
        "--sampling-only", action="store_true", help="time sampling alone (no training)"
    )
    parser.add_argument(
        "--one-at-a-time", action="store_true", help="also time generate one prompt at a time"
    )
    parser.add_argument("--profile", action="store_true", help="print torch profiles (CUDA)")
    parser.add_argument(
        "--e2e-steps", type=int, default=0, help="then time a real run through the server"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# local backend benchmark: {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), {platform.processor() or platform.machine()}, "
        f"CUDA {'yes' if cuda else 'no'}"
    )
    ceilings = None
    if cuda:
        import transformers

        print(f"# {gpu.device_line()}, transformers {transformers.__version__}")
        ceilings = gpu.measure_ceilings()
        print(
            f"# measured: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s (read + written), "
            f"bf16 matrix product {ceilings.bf16_flops / 1e12:.0f} TFLOP/s"
        )
    for alias in args.models.split(","):
        bench_model(ALIASES.get(alias.strip(), alias.strip()), args, ceilings)


if __name__ == "__main__":
    main()
