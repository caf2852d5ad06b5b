"""What each run's cost (issue 36) adds to listing runs: `GET /runs`'s service call and its JSON
for a page of runs that all recorded a cost, priced at RLCS_PRICE_* settings, against the same
list with the pricing left out (the baseline), alternated; CPU time, best of --repeats; then the
same through the app (FastAPI's checks of the answer, an HTTP client in this process).
Run from the repo root: .venv/bin/python -m benchmarks.run_cost [--runs 1000] [--page 100]"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from core.db import make_engine, write_session
from core.models import Run, RunStatus
from core.settings import Settings
from server.app import create_app
from server.runs.schemas import RunSummaryOut


class NoPricing:
    """The baseline: the list as it was before cost, no cost per run."""

    def brief(self, run: Any, model_name: str | None) -> None:
        return None


def seed(settings: Settings, count: int) -> None:
    engine = make_engine(settings.db_url)
    with write_session(engine) as session:
        for i in range(count):
            session.add(
                Run(
                    id=f"r-{i:08x}",
                    environment="arithmetic",
                    status=RunStatus.succeeded,
                    config_json=json.dumps({"model_name": "tiny-random"}),
                    config_hash="h",
                    run_dir="/nowhere",
                    step=10,
                    total_steps=10,
                    cost_device="cpu",
                    cost_device_s=100.0 + i,
                    cost_cpu_s=150.0 + i,
                    cost_tokens_prefill=40_000,
                    cost_tokens_sampled=8_000,
                    cost_tokens_trained=48_000,
                )
            )
    engine.dispose()


def alternate(modes: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Each mode's timings, the modes taking turns so the machine's load falls on all."""
    out: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(repeats):
        for name, measure in modes.items():
            out[name].append(measure())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--page", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPU cores, load average "
        f"{os.getloadavg()[0]:.1f}; {args.runs} runs, pages of {args.page}, {args.repeats} "
        "each, alternated"
    )
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            var_dir=Path(tmp) / "var",
            inference_warmup=False,
            allowed_hosts=["testserver"],
            price_device_hour=2.5,
            price_per_mtok_sampled=0.6,
            price_per_mtok_trained=0.44,
        )
        with TestClient(create_app(settings)) as client:
            seed(settings, args.runs)
            runs = client.app.state.services.runs
            views = runs._views
            pricing, baseline = views._pricing, NoPricing()
            answers = TypeAdapter(list[RunSummaryOut])

            def cpu(mode: Any) -> Callable[[], float]:
                def measure() -> float:
                    views._pricing = mode
                    started = time.process_time()
                    answers.dump_json(runs.list(limit=args.page))
                    return time.process_time() - started

                return measure

            def http(mode: Any) -> Callable[[], float]:
                def measure() -> float:
                    views._pricing = mode
                    started = time.process_time()
                    assert client.get("/runs", params={"limit": args.page}).status_code == 200
                    return time.process_time() - started

                return measure

            cpu_times = alternate({"cost": cpu(pricing), "none": cpu(baseline)}, args.repeats)
            http_times = alternate({"cost": http(pricing), "none": http(baseline)}, args.repeats)
    with_cost, without = min(cpu_times["cost"]), min(cpu_times["none"])
    print(f"\n  GET /runs (limit {args.page}): the service call and its JSON, CPU, best")
    print(f"    with each run's cost   {1000 * with_cost:7.2f} ms")
    print(f"    without (baseline)     {1000 * without:7.2f} ms")
    per_run = 1e6 * (with_cost - without) / args.page
    print(f"    ratio                  {with_cost / without:7.3f}x  ({per_run:.1f} us a run)")
    with_cost, without = (min(http_times[k]) for k in ("cost", "none"))
    print(f"\n  GET /runs (limit {args.page}) through the app (FastAPI, HTTP client), CPU, best")
    print(f"    with each run's cost   {1000 * with_cost:7.2f} ms")
    print(f"    without (baseline)     {1000 * without:7.2f} ms")
    per_run = 1e6 * (with_cost - without) / args.page
    print(f"    ratio                  {with_cost / without:7.3f}x  ({per_run:.1f} us a run)")


if __name__ == "__main__":
    main()
