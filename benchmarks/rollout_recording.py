"""What recording rollouts costs a training step at 64 episodes x 64 tokens: the real runner's
loop (runners.train.loop.Trainer, local backend, repeat_word) as two runs side by side, their
steps interleaved and alternated, one recording every episode (rollouts_per_step 256) and one
recording none (0, the baseline). Prints each one's step time, their ratio, and the recording's
own cost: on the training path (building and picking the records) and in its writer thread
(the database's transaction, and with --wandb the W&B table).
Run from the repo root:
.venv/bin/python -m benchmarks.rollout_recording [--steps 12] [--model tiny-random] [--wandb]"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core import rollout_store, schema
from core.db import make_engine, read_session, write_session
from core.models import Run, RunStatus
from core.rollout_store import Filters
from core.run_folder import RunFolder
from core.settings import PROJECT_ROOT, Settings
from core.spec import RunSpec
from runners.train.loop import Trainer

EPISODES_PER_GROUP, GROUPS, TOKENS = 8, 8, 64


def run_config(model: str, steps: int, per_step: int, wandb: bool) -> dict[str, Any]:
    return {
        "model_name": model,
        "lora_rank": 8,
        "learning_rate": 1e-4,
        "group_size": EPISODES_PER_GROUP,
        "batch_size": GROUPS,
        "max_token_length": TOKENS,
        "total_steps": steps,
        "save_every": 0,
        "steps_per_eval": 0,
        "use_wandb": wandb,
        "rollouts_per_step": per_step,
        "seed": 3,
    }


def trainer(settings: Settings, run_id: str, config: dict[str, Any]) -> Trainer:
    """A run's folder, row and runner, as the server and `python -m runners.train` make them."""
    spec = RunSpec(
        run_id=run_id,
        environment="repeat_word",
        env_file=str(PROJECT_ROOT / "environments" / "repeat_word.py"),
        env_class="RepeatWordEnv",
        config_hash="bench",
        config=config,
    )
    folder = RunFolder(settings.runs_dir / run_id)
    folder.create(spec)
    engine = make_engine(settings.db_url)
    with write_session(engine) as session:
        session.add(
            Run(
                id=run_id,
                environment="repeat_word",
                status=RunStatus.running,
                config_json=json.dumps(config),
                config_hash="bench",
                run_dir=str(folder.path),
            )
        )
    return Trainer(settings, folder, spec, engine)


class Timer:
    """Seconds spent in a wrapped function, per call."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls.append(time.perf_counter() - start)

        return timed


async def bench(settings: Settings, args: argparse.Namespace) -> None:
    steps = args.steps + 1  # the first is a warm-up (allocations, first graphs)
    recording = "recording (256 per step)"
    runs = {
        recording: trainer(settings, "r-0000000a", run_config(args.model, steps, 256, args.wandb)),
        "baseline: not recording (0)": trainer(
            settings, "r-0000000b", run_config(args.model, steps, 0, args.wandb)
        ),
    }
    on = runs[recording]
    async with contextlib.AsyncExitStack() as exits:
        opened = {name: await t.open_run(exits) for name, t in runs.items()}
        reporter = opened[recording].reporter
        on_path = Timer()  # building and picking the records, on the training path
        reporter.rollouts = on_path.wrap(reporter.rollouts)  # type: ignore[method-assign]
        writer = Timer()  # the writer thread's transaction per step
        rollout_store.write_step = writer.wrap(rollout_store.write_step)
        tables = Timer()  # and its W&B table (with --wandb)
        recorder = reporter._rollouts
        if recorder._on_written is not None:
            recorder._on_written = tables.wrap(recorder._on_written)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for step in range(1, steps + 1):
            order = list(runs.items()) if step % 2 else list(runs.items())[::-1]
            for name, run in order:
                start = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):  # the runner's per-step lines
                    await run.train_step(opened[name], step)
                if step > 1:
                    times[name].append(time.perf_counter() - start)
        for context in opened.values():
            context.reporter.finish_wandb()  # the recorder's queue written
    report(times, on_path.calls[1:], writer.calls[1:], tables.calls[1:], settings, on.run_id)


def report(
    times: dict[str, list[float]],
    on_path: list[float],
    writes: list[float],
    tables: list[float],
    settings: Settings,
    run_id: str,
) -> None:
    (on_name, on), (off_name, off) = times.items()
    on_s, off_s = statistics.median(on), statistics.median(off)
    print(f"\n  {'run':<30} {'median s/step':>13} {'min':>7} {'max':>7}")
    for name, values in times.items():
        print(
            f"  {name:<30} {statistics.median(values):>13.3f} {min(values):>7.3f} "
            f"{max(values):>7.3f}"
        )
    per_step = statistics.median(a / b for a, b in zip(on, off, strict=True))
    path_s, write_s = statistics.median(on_path), statistics.median(writes)
    table_s = statistics.median(tables) if tables else 0.0
    with read_session(make_engine(settings.db_url)) as session:
        kept = rollout_store.page(session, run_id, Filters(), 100_000)
    tokens = [json.loads(row.body_json)["completion_tokens"] for row in kept]
    size_mb = sum(row.size for row in kept) / 1e6
    lines = [
        f"recording / baseline: {on_s / off_s:.3f}x by medians ({per_step:.3f}x median of the "
        "per-step ratios)",
        f"on the training path (build + pick, per step): {path_s * 1e3:.1f} ms = "
        f"{path_s / off_s:.2%} of a step",
        f"writer thread, off the path (one transaction per step): {write_s * 1e3:.1f} ms = "
        f"{write_s / off_s:.2%} of a step",
        f"  and its W&B table: {table_s * 1e3:.1f} ms = {table_s / off_s:.2%} of a step"
        if tables
        else "  and its W&B table: none (W&B off; --wandb)",
        f"kept: {len(kept)} episodes of {statistics.mean(tokens):.1f} tokens on average, "
        f"{size_mb:.2f} MB",
    ]
    print("\n" + "\n".join(f"  {line}" for line in lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12, help="timed steps per run")
    parser.add_argument(
        "--model", default="tiny-random", help="e.g. HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    parser.add_argument("--wandb", action="store_true", help="W&B on (offline): tables too")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPU cores, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(
        f"{args.model}, repeat_word, {GROUPS} groups x {EPISODES_PER_GROUP} episodes, up to "
        f"{TOKENS} tokens each, W&B {'offline' if args.wandb else 'off'}; {args.steps} steps "
        "each after a warm-up, interleaved"
    )
    with tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp:
        settings = Settings(var_dir=Path(tmp), models_dir=PROJECT_ROOT / "var" / "models")
        schema.upgrade(make_engine(settings.db_url))
        asyncio.run(bench(settings, args))


if __name__ == "__main__":
    main()
