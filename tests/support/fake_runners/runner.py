"""A stand-in runner for supervision tests: plays the runner's side of the contract.

Behaviour comes from the environment (inherited from the test process):
FAKE_RUNNER_MODE = steps (default) | ignore_term | crash | no_end,
FAKE_RUNNER_STEP_S = seconds per step (default 0.05). Steps = the run's total_steps.
FAKE_RUNNER_PROGRESS=1 adds, before each step's line, a progress bar redrawn with a bare CR
and a line that ends in CRLF.
It also starts a grandchild (`sleep`) that it never ends itself, so tests can check that the
supervisor leaves no process of the run's group behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from core import lifecycle
from core.cost import Spent
from core.db import make_engine
from core.models import RunStatus
from core.procs import process_start_time
from core.settings import Settings


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args()
    frozen = json.loads((args.run_dir / "config.json").read_text())
    run_id = frozen["run_id"]
    engine = make_engine(Settings().db_url)
    mode = os.environ.get("FAKE_RUNNER_MODE", "steps")
    step_s = float(os.environ.get("FAKE_RUNNER_STEP_S", "0.05"))
    progress = os.environ.get("FAKE_RUNNER_PROGRESS") == "1"
    stop = {"asked": False}

    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))

    grandchild = subprocess.Popen(["sleep", "300"])
    (args.run_dir / "grandchild.pid").write_text(str(grandchild.pid))
    lifecycle.record_running(engine, run_id, os.getpid(), process_start_time(os.getpid()))
    print(f"fake runner {run_id} up, mode={mode}", flush=True)

    if mode == "crash":
        print("about to fail: ValueError: the fake runner crashes on purpose", flush=True)
        return 3
    for step in range(1, frozen["config"]["total_steps"] + 1):
        if stop["asked"]:
            lifecycle.record_end(
                engine, run_id, RunStatus.stopped, details=f"stopped at step {step - 1}"
            )
            print("stopped", flush=True)
            return 0
        time.sleep(step_s)
        # What a step spends, as the real runner's meter charges it (core/cost.py).
        spent = Spent(step_s, step_s / 2, 30, 10, 40, device="cpu")
        metrics = {"reward/mean": step / 10, "train/loss": 1.0}
        lifecycle.record_step(engine, run_id, step, metrics, spent=spent)
        if progress:
            print(f"batch {step}: 50%\rbatch {step}: 100%", flush=True)
            print(f"windows line {step}", end="\r\n", flush=True)
        print(f"step {step}", flush=True)
    if mode == "no_end":
        return 0
    lifecycle.record_end(engine, run_id, RunStatus.succeeded)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
