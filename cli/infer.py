"""`infer`: sample a model (or a run's adapter) on prompts or environment tasks, with scores."""

from __future__ import annotations

import argparse
from typing import Any

from cli.client import Client
from cli.exits import OK, UsageError
from cli.output import clean, fmt, print_json, say

# Loading a model the first time can take minutes; the server bounds each request itself
# (RLCS_INFERENCE_TIMEOUT_S), so the client only needs to outlast it.
INFER_TIMEOUT_S = 600.0


def infer(client: Client, args: argparse.Namespace) -> int:
    if bool(args.prompts) == (args.items is not None):
        raise UsageError(
            "give PROMPTs or --items N (tasks drawn from the environment): one of the two"
        )
    body: dict[str, Any] = {
        "prompts": args.prompts or None,
        "num_items": args.items,
        "environment": args.env,
        "model": args.model,
        "run_id": args.run,
        "checkpoint_step": args.step,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
    }
    body = {k: v for k, v in body.items() if v is not None}
    timeout = args.timeout if args.timeout is not None else INFER_TIMEOUT_S
    answer = client.post("/test/inference", body, timeout=timeout)
    if args.json:
        print_json(answer)
        return OK
    adapter = f" + adapter {answer['adapter']}" if answer.get("adapter") else ""
    say(
        f"environment {answer['environment']}  model {answer['model']}{adapter}  "
        f"backend {answer.get('backend')}"
    )
    for number, result in enumerate(answer.get("results", []), start=1):
        verdict = f"score {fmt(result.get('score'))}  correct {fmt(result.get('correct'))}"
        say(f"\n[{number}] {verdict}  tokens {result.get('tokens')}")
        say(_block("prompt", result.get("prompt")))
        say(_block("response", result.get("response")))
        if result.get("reason"):
            say(f"  note: {clean(result['reason'], newlines=False)}")
    summary = answer.get("summary") or {}
    say("\nsummary  " + "  ".join(f"{k} {fmt(v)}" for k, v in summary.items()))
    return OK


def _block(label: str, text: str | None) -> str:
    if text is None:
        return f"  {label}: -"
    lines = clean(text).splitlines() or [""]
    pad = " " * (len(label) + 4)
    return f"  {label}: {lines[0]}" + "".join(f"\n{pad}{line}" for line in lines[1:])
