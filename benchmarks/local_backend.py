"""Local backend throughput: batched KV-cache sampling against `generate` one prompt at a time.

Also training tokens per second for forward_backward (+ optim_step). Run from the repo root:
    .venv/bin/python -m benchmarks.local_backend --models tiny-random,smollm2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
from tinker import types

from core.model_names import SMOLLM2, TINY_RANDOM
from runners.backends.decoding import left_pad
from runners.backends.local import LocalSamplingClient, LocalServiceClient, LocalTrainingClient

ALIASES = {"tiny-random": TINY_RANDOM, "tiny": TINY_RANDOM, "smollm2": SMOLLM2}
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
    """All prompts sampled by concurrent callers (one asyncio task each), as the loop does."""
    params = [
        types.SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=i, stop=[])
        for i in range(len(prompts))
    ]

    async def run() -> list[types.SampleResponse]:
        return await asyncio.gather(
            *(
                sampler.sample(types.ModelInput.from_ints(p), 1, params[i])
                for i, p in enumerate(prompts)
            )
        )

    started = time.perf_counter()
    responses = asyncio.run(run())
    elapsed = time.perf_counter() - started
    assert all(len(r.sequences[0].tokens) == new_tokens for r in responses)
    return elapsed


def time_sequential(
    sampler: LocalSamplingClient, prompts: list[list[int]], new_tokens: int
) -> float:
    """Our sampler again, but one prompt at a time (no batching to gain from)."""
    started = time.perf_counter()
    for i, p in enumerate(prompts):
        params = types.SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=i, stop=[])
        sampler.sample(types.ModelInput.from_ints(p), 1, params).result()
    return time.perf_counter() - started


def generate_exactly(model, ids: torch.Tensor, mask: torch.Tensor, new: int, pad_id: int) -> None:
    """transformers' generate, sampling at temperature 1, forced to exactly `new` tokens."""
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
        )
    assert out.shape[1] - ids.shape[1] == new


def time_generate_batched(model, prompts: list[list[int]], new_tokens: int, pad_id: int) -> float:
    """generate on all prompts as one left-padded batch (dynamic KV cache)."""
    ids, mask = left_pad(prompts, pad_id)
    started = time.perf_counter()
    generate_exactly(model, ids, mask, new_tokens, pad_id)
    return time.perf_counter() - started


def time_generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int) -> float:
    """generate, one prompt at a time."""
    started = time.perf_counter()
    for p in prompts:
        ids = torch.tensor([p])
        generate_exactly(model, ids, torch.ones_like(ids), new_tokens, pad_id)
    return time.perf_counter() - started


def time_training(
    trainer: LocalTrainingClient, prompts: list[list[int]], new_tokens: int, repeats: int
) -> tuple[float, float, int]:
    """Seconds per forward_backward and per forward_backward + optim_step, and tokens per call."""
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


def bench_model(name: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        service = LocalServiceClient(
            checkpoint_dir=Path(tmp), models_dir=Path(args.models_dir), device=args.device
        )
        try:
            started = time.perf_counter()
            trainer = service.create_lora_training_client(name, rank=args.rank, seed=0).result()
            load_s = time.perf_counter() - started
            sampler = trainer.save_weights_and_get_sampling_client().result()
            model = trainer._host.model  # the same peft model the sampler uses
            tokenizer = trainer.get_tokenizer()
            prompts = chat_prompts(tokenizer, args.prompts)
            n, new = len(prompts), args.new_tokens
            warm = prompts[:2]
            time_batched(sampler, warm, 4)
            time_generate(model, warm[:1], 4, tokenizer.pad_token_id)

            batched = time_batched(sampler, prompts, new)
            generate_batched = time_generate_batched(model, prompts, new, tokenizer.pad_token_id)
            generate = time_generate(model, prompts, new, tokenizer.pad_token_id)
            sequential = time_sequential(sampler, prompts, new) if args.sequential else None
            fb, step, train_tokens = time_training(trainer, prompts, new, args.repeats)
        finally:
            service.close()

    total = n * new
    plen = sum(len(p) for p in prompts) / n
    print(f"\n## {name}  (load {load_s:.1f} s, LoRA rank {args.rank}, device {service.device})")
    print(f"sampling: {n} prompts (mean {plen:.0f} tokens) x {new} new tokens = {total} tokens")
    print(f"  batched + KV cache (ours)      {batched:8.2f} s  {total / batched:9.1f} tok/s")
    if sequential is not None:
        print(
            f"  ours, one prompt at a time     {sequential:8.2f} s  {total / sequential:9.1f} tok/s"
        )
    print(f"  HF generate, one at a time     {generate:8.2f} s  {total / generate:9.1f} tok/s")
    print(
        f"  HF generate, batched           {generate_batched:8.2f} s  "
        f"{total / generate_batched:9.1f} tok/s"
    )
    print(f"  ours vs generate one at a time: {generate / batched:.2f}x")
    print(f"  ours vs generate batched:       {generate_batched / batched:.2f}x")
    print(f"training: {n} sequences, {train_tokens} tokens per call")
    print(f"  forward_backward               {fb:8.2f} s  {train_tokens / fb:9.1f} tok/s")
    print(f"  forward_backward + optim_step  {step:8.2f} s  {train_tokens / step:9.1f} tok/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-random,smollm2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--models-dir", default="var/models")
    parser.add_argument(
        "--sequential", action="store_true", help="also time our sampler one prompt at a time"
    )
    args = parser.parse_args()
    print(
        f"# local backend benchmark: {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), {platform.processor() or platform.machine()}, "
        f"CUDA {'yes' if torch.cuda.is_available() else 'no'}"
    )
    for alias in args.models.split(","):
        bench_model(ALIASES.get(alias.strip(), alias.strip()), args)


if __name__ == "__main__":
    main()
