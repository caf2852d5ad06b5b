"""What training through another framework's door costs: steps per minute of a run on the
same task written for Atropos (runner + inference face + atroposlib's trajectory API + the
environment's process) or for verifiers (runner + inference face + the environment's driver)
against it written as one of ours (repeat_word), on the real server, SmolLM2-135M on the CPU,
the same batch (groups x group size, tokens), one after the other, alternating.
Run from the repo root: .venv/bin/python -m benchmarks.doors --door atropos|verifiers
[--steps 8] [--rounds 2]"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.inference import Server
from core.model_names import SMOLLM2
from core.settings import PROJECT_ROOT

TERMINAL = {"succeeded", "failed", "stopped"}
# Each door's environment folder and its environment's name there.
DOORS = {
    "atropos": (PROJECT_ROOT / "benchmarks" / "atropos_env", "repeat_word_atropos"),
    "verifiers": (PROJECT_ROOT / "benchmarks" / "verifiers_env", "repeat-word-vf"),
}


@dataclass
class Timed:
    kind: str
    first_step_s: float  # POST /runs -> step 1 recorded (start-up included)
    step_s: list[float]  # time/step_s of the steps after the first
    tokens: list[float]  # tokens trained per step (the work a step does)

    @property
    def steps_per_min(self) -> float:
        return 60.0 * len(self.step_s) / sum(self.step_s)


def run_once(
    url: str, kind: str, steps: int, groups: int, size: int, tokens: int, lr: float
) -> Timed:
    """One run of `kind`: "native", or a door's name."""
    common: dict[str, Any] = {
        "model_name": SMOLLM2,
        "lora_rank": 8,
        "learning_rate": lr,
        "total_steps": steps,
        "save_every": 0,
        "use_wandb": False,
        "group_size": size,
    }
    if kind == "native":
        body = {
            "environment": "repeat_word",
            "batch_size": groups,
            "steps_per_eval": 0,
            "max_token_length": tokens,
            **common,
        }
    elif kind == "atropos":
        body = {
            "environment": DOORS[kind][1],
            "groups_per_step": groups,
            "steps_per_eval": 0,
            "max_token_length": tokens,
            **common,
        }
    else:
        body = {
            "environment": DOORS[kind][1],
            "groups_per_step": groups,
            "max_tokens": tokens,
            **common,
        }
    with httpx.Client(base_url=url, timeout=60) as client:
        posted = time.monotonic()
        answer = client.post("/runs", json=body)
        answer.raise_for_status()
        run_id = answer.json()["run_id"]
        first = None
        while True:
            run = client.get(f"/runs/{run_id}").json()
            if first is None and run["step"] >= 1:
                first = time.monotonic() - posted
            if run["status"] in TERMINAL:
                break
            time.sleep(0.2)
        if run["status"] != "succeeded":
            logs = client.get(f"/runs/{run_id}/logs?tail=30").json()["lines"]
            raise RuntimeError(f"{kind} run {run['status']}: {run['error']}\n" + "\n".join(logs))
        history = client.get(f"/runs/{run_id}/history").json()["rows"]
        rows = [r for r in history if "time/step_s" in r]
    rows.sort(key=lambda r: r["step"])
    return Timed(
        kind,
        first or 0.0,
        [r["time/step_s"] for r in rows[1:]],
        [r.get("train/num_action_tokens", 0.0) for r in rows[1:]],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--door", choices=sorted(DOORS), default="atropos")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--groups", type=int, default=4, help="groups per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="most tokens per answer")
    # Small: the policy barely moves, so both runs sample answers of the same length (a step's
    # time is mostly its tokens; a policy that learns to stop early makes its steps cheaper).
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    args = parser.parse_args()
    door = args.door
    timed: dict[str, list[Timed]] = {"native": [], door: []}
    with tempfile.TemporaryDirectory(prefix=f"bench-{door}-") as tmp:
        models = os.environ.get("RLCS_MODELS_DIR", str(PROJECT_ROOT / "var" / "models"))
        env = {
            "RLCS_ENV_DIRS": json.dumps([str(DOORS[door][0])]),
            "RLCS_MODELS_DIR": models,  # SmolLM2 converted once, shared with `make serve`
            "RLCS_DEVICE": "cpu",
        }
        with Server(Path(tmp) / "var", **env) as server:
            for round_ in range(args.rounds):
                order = ("native", door) if round_ % 2 == 0 else (door, "native")
                for kind in order:
                    one = run_once(
                        server.url,
                        kind,
                        args.steps,
                        args.groups,
                        args.group_size,
                        args.tokens,
                        args.learning_rate,
                    )
                    timed[kind].append(one)
                    print(
                        f"round {round_ + 1} {kind:8s} first step {one.first_step_s:6.1f} s, "
                        f"then {one.steps_per_min:5.2f} steps/min "
                        f"(median step {statistics.median(one.step_s):.2f} s, "
                        f"{statistics.mean(one.tokens):.0f} tokens trained per step)",
                        flush=True,
                    )
    native, other = (statistics.median(t.steps_per_min for t in timed[k]) for k in ("native", door))
    first_native, first_other = (
        statistics.median(t.first_step_s for t in timed[k]) for k in ("native", door)
    )
    print()
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"SmolLM2-135M on the CPU, {args.groups} groups x {args.group_size}, "
        f"{args.tokens} tokens, {args.steps} steps x {args.rounds} rounds"
    )
    tokens = {k: statistics.mean(x for t in timed[k] for x in t.tokens) for k in timed}
    print("| run | steps/min (after step 1) | tokens trained per step | POST /runs -> step 1 |")
    print("|---|---:|---:|---:|")
    print(f"| ours (repeat_word) | {native:.2f} | {tokens['native']:.0f} | {first_native:.1f} s |")
    print(f"| {door} (the same task) | {other:.2f} | {tokens[door]:.0f} | {first_other:.1f} s |")
    print(
        f"| cost of {door} (native / {door}) | {native / other:.2f}x | | "
        f"{first_other / first_native:.2f}x |"
    )


if __name__ == "__main__":
    main()
