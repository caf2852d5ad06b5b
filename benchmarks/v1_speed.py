"""Sampling through the server against plain `generate`: /v1/chat/completions on SmolLM2 (its
base model, and a run's checkpoint with a rank-8 adapter), every choice decoding exactly the
same number of tokens (vLLM's min_tokens and ignore_eos), against transformers' batched
`generate` on the plain model (no adapter, no peft), the faster of float32 and bfloat16, on the
same prompt, timed in this process side by side.

Rows: 3 (one request, n=3) and 16 (two concurrent requests, n=8 each, as two clients would).

Run from the repo root (about 10 minutes on 2 CPU cores; the first part trains one step):
    .venv/bin/python -m benchmarks.v1_speed [--rounds 3] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from benchmarks.local_backend import generate_exactly
from core.model_names import SMOLLM2, smollm2_is_converted
from runners.engine.padding import left_pad
from runners.models import loading
from tests.support.helpers import finish_run, start_run
from tests.support.live_server import LiveServer

QUESTION = [{"role": "user", "content": "Tell me about rivers."}]
RUN = {
    "environment": "repeat_word",
    "model_name": SMOLLM2,
    "total_steps": 1,
    "save_every": 1,
    "steps_per_eval": 0,
    "use_wandb": False,
    "group_size": 2,
    "batch_size": 1,
    "max_token_length": 8,
    "lora_rank": 8,
}
# (rows, requests): 3 rows as one request of n=3, 16 as two concurrent requests of n=8.
SHAPES = ((3, 1), (16, 2))


def chat(api: httpx.Client, model: str, n: int, new: int, seed: int) -> int:
    """One completion of `n` choices of exactly `new` tokens; the tokens it decoded."""
    body = {
        "model": model,
        "messages": QUESTION,
        "max_tokens": new,
        "min_tokens": new,
        "ignore_eos": True,
        "n": n,
        "temperature": 1.0,
        "seed": seed,
    }
    answer = api.post("/v1/chat/completions", json=body, timeout=600)
    answer.raise_for_status()
    usage = answer.json()["usage"]["completion_tokens"]
    assert usage == n * new, f"asked for {n} x {new} tokens, decoded {usage}"
    return usage


def time_server(api: httpx.Client, model: str, rows: int, requests: int, new: int) -> float:
    """Seconds for `requests` concurrent requests sharing `rows` choices."""
    n = rows // requests
    started = time.perf_counter()
    with ThreadPoolExecutor(requests) as pool:
        done = list(pool.map(lambda i: chat(api, model, n, new, seed=i), range(requests)))
    assert sum(done) == rows * new
    return time.perf_counter() - started


def prompt_ids(tokenizer) -> list[int]:
    """The prompt the server builds for QUESTION (the chat template, up to the answer)."""
    text = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def time_generate(model, prompt: list[int], rows: int, new: int, pad: int) -> float:
    ids, mask = left_pad([prompt] * rows, pad)
    started = time.perf_counter()
    generate_exactly(model, ids, mask, new, pad)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timings of each route (best)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--models-dir", default="var/models")
    args = parser.parse_args()
    models_dir = Path(args.models_dir).resolve()
    if not smollm2_is_converted(models_dir):
        raise SystemExit(f"SmolLM2 is not converted in {models_dir}: run make install first")
    print(
        f"# /v1 against generate: {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), {platform.processor() or platform.machine()}, "
        f"{args.new_tokens} tokens per row, best of {args.rounds}"
    )
    plain = {}
    for dtype in ("float32", "bfloat16"):
        model, tokenizer = loading.load_model_and_tokenizer(SMOLLM2, models_dir, "cpu", dtype)
        plain[f"generate, plain {dtype}"] = model
    prompt = prompt_ids(tokenizer)
    pad = int(tokenizer.pad_token_id or 0)
    with tempfile.TemporaryDirectory() as tmp:
        # A request's time budget (24 s by default) would cut rows short on a busy machine.
        server = LiveServer(
            Path(tmp) / "var",
            RLCS_MODELS_DIR=str(models_dir),
            RLCS_INFERENCE_BUDGET_S="600",
            RLCS_INFERENCE_TIMEOUT_S="600",
        ).start(60)
        try:
            with httpx.Client(base_url=server.url, timeout=600) as api:
                run = start_run(api, **RUN)
                status = finish_run(api, run, timeout=1800)["status"]
                assert status == "succeeded", f"the run that makes the checkpoint {status}"
                routes: dict[str, Callable[[int, int], float]] = {}
                for label, model_id in (("/v1, base model", SMOLLM2), ("/v1, checkpoint", run)):
                    routes[label] = lambda rows, requests, m=model_id: time_server(
                        api, m, rows, requests, args.new_tokens
                    )
                for label, model in plain.items():
                    routes[label] = lambda rows, requests, m=model: time_generate(
                        m, prompt, rows, args.new_tokens, pad
                    )
                report(routes, args.rounds, args.new_tokens)
        finally:
            server.kill()


def report(routes: dict[str, Callable[[int, int], float]], rounds: int, new: int) -> None:
    """Each shape: every route warmed once, then `rounds` turns of all of them (a change of
    load falls on all alike); the best time of each, against the fastest generate."""
    for rows, requests in SHAPES:
        for timer in routes.values():
            timer(rows, requests)
        best = dict.fromkeys(routes, float("inf"))
        for _ in range(rounds):
            for label, timer in routes.items():
                best[label] = min(best[label], timer(rows, requests))
        baseline = min(s for label, s in best.items() if label.startswith("generate"))
        shape = f"{rows} rows" + (f" ({requests} requests of n={rows // requests})")
        print(f"\n{shape}, {new} tokens each")
        print(f"  {'route':28} {'seconds':>8} {'tok/s':>8} {'x fastest generate':>19}")
        for label, seconds in best.items():
            print(
                f"  {label:28} {seconds:8.2f} {rows * new / seconds:8.1f} "
                f"{baseline / seconds:18.2f}x"
            )


if __name__ == "__main__":
    main()
