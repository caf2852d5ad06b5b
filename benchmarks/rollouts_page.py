"""How long a run's page takes to show a step of 1,000 recorded episodes, in headless chromium
against the real server: from navigation until the Rollouts view's table holds every row (best
and worst shown), against the baseline of the same page for a run that recorded none, until its
view says so. Alternated, median of --repeats each. Needs chromium (Debian's package) and
Playwright (the dev extra). Run from the repo root:
.venv/bin/python -m benchmarks.rollouts_page [--episodes 1000] [--repeats 7]"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from core import rollout_store
from core.db import make_engine, write_session
from core.models import Run, RunStatus
from core.rollouts import RolloutRecord, Segment, pick
from tests.support.live_server import LiveServer

FULL, EMPTY = "r-0000f011", "r-0000e3e7"
LOADED = """n => document.querySelectorAll(
  '[data-testid=rollouts-table] .rollout-row[data-at]').length === n
  && document.querySelector('[data-testid=rollouts-best] .rollout-card') !== null"""
NOTHING = """() => (document.querySelector('[data-testid=rollouts-step-label]') || {}).textContent
  === 'no steps recorded yet' && document.querySelector('[data-testid=run-status]').textContent
  === 'succeeded'"""


def episode(index: int) -> RolloutRecord:
    """About what a single-turn chat task gives: a templated prompt, a 64-token answer."""
    prompt = f"system\nYou are a helpful assistant.\nuser\nWhat is {index} + {index * 7}? Put the "
    prompt += "final answer in \\boxed{}.\nassistant\n"
    completion = (
        f"Let me add {index} and {index * 7} step by step. " * 4 + f"\\boxed{{{index * 8}}}"
    )
    reward = float(index % 3 == 0)
    return RolloutRecord(
        kind="episode",
        group=index // 8,
        index=index,
        prompt=prompt,
        completion=completion,
        reward=reward,
        advantage=reward - 1 / 3,
        segments=[Segment("env", prompt, 40), Segment("model", completion, 64, reward=reward)],
        finish_reason="stop",
        prompt_tokens=40,
        completion_tokens=64,
        logprob_mean=-0.7,
    )


def seed(db_url: str, episodes: int) -> None:
    engine = make_engine(db_url)
    with write_session(engine) as session:
        for run_id in (FULL, EMPTY):
            session.add(
                Run(
                    id=run_id,
                    environment="arithmetic",
                    status=RunStatus.succeeded,
                    config_json=json.dumps({"model_name": "tiny-random"}),
                    config_hash="bench",
                    run_dir="/nowhere",
                    step=1,
                    total_steps=1,
                )
            )
    records = [episode(i) for i in range(episodes)]
    rollout_store.write_step(
        engine, FULL, 1, pick(records, episodes, 0), sampled=records, max_bytes=10**10
    )
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no chromium: apt-get install -y --no-install-recommends chromium")
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPU cores, load average "
        f"{os.getloadavg()[0]:.1f}; headless chromium, {args.repeats} loads each, alternated"
    )
    with tempfile.TemporaryDirectory(prefix="rollouts-page-") as tmp:
        var = Path(tmp) / "var"
        with LiveServer(var) as live, sync_playwright() as pw:
            seed(f"sqlite:///{var / 'rlcs.db'}", args.episodes)
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            times: dict[str, list[float]] = {"full": [], "empty": []}
            for repeat in range(args.repeats + 1):  # the first of each warms the caches
                order = ["full", "empty"] if repeat % 2 else ["empty", "full"]
                for which in order:
                    run_id = FULL if which == "full" else EMPTY
                    page.goto("about:blank")
                    page.goto(f"{live.url}/#/runs/{run_id}")
                    if which == "full":
                        page.wait_for_function(LOADED, arg=args.episodes, polling="raf")
                    else:
                        page.wait_for_function(NOTHING, polling="raf")
                    shown_ms = page.evaluate("performance.now()")
                    if repeat:
                        times[which].append(shown_ms / 1e3)
            browser.close()
    full, empty = statistics.median(times["full"]), statistics.median(times["empty"])
    print(f"\n  {'page':<44} {'median s':>8} {'min':>6} {'max':>6}")
    for label, values in (
        (f"run page, a step of {args.episodes} episodes", times["full"]),
        ("baseline: run page, nothing recorded", times["empty"]),
    ):
        print(
            f"  {label:<44} {statistics.median(values):>8.3f} {min(values):>6.3f} "
            f"{max(values):>6.3f}"
        )
    print(
        f"\n  {args.episodes} episodes / nothing: {full / empty:.2f}x; the episodes add "
        f"{(full - empty) * 1e3:.0f} ms (goal: the page with them shown under 1 s)"
    )


if __name__ == "__main__":
    main()
