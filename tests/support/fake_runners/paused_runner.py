"""The real runner (runners.train.loop) with hooks for crash tests, set from the environment:

FAKE_PAUSE_AT = resume | sampling:<step> | training:<step> | checkpoint:<name>/<kind> (e.g.
checkpoint:step-000004/state), or several, comma-separated: there it writes `paused` in its run
folder and waits until the test removes it (or kills the process). A resume pauses before it
picks its checkpoint, sampling once the step's episodes are in, training once its optimizer
step is done, a checkpoint once its files are written (not yet sealed).
FAKE_DISK_FULL_AT = <name>/<kind>: writing that checkpoint folder fails with ENOSPC after its
files are written, as the last write would on a full disk.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runners.engine import checkpoints
from runners.episodes.collection import Collector
from runners.train import loop as train
from runners.train import run_base

PAUSED = "paused"
_DEADLINE_S = 120.0  # never outlive a test that forgot us


def main() -> int:
    run_dir = Path(sys.argv[sys.argv.index("--run-dir") + 1])
    marker = run_dir / PAUSED
    pause_at = set(filter(None, os.environ.get("FAKE_PAUSE_AT", "").split(",")))
    disk_full_at = os.environ.get("FAKE_DISK_FULL_AT", "")

    def reached(point: str) -> bool:
        if point not in pause_at:
            return False
        marker.write_text(point)
        print(f"paused at {point}", flush=True)
        return True

    def wait_sync() -> None:
        deadline = time.monotonic() + _DEADLINE_S
        while marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    async def wait_async() -> None:
        deadline = time.monotonic() + _DEADLINE_S
        while marker.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    train_batch = Collector.train_batch

    async def sampled(self: Collector, policy: Any, step: int) -> Any:
        collected = await train_batch(self, policy, step)
        if reached(f"sampling:{step}"):
            await wait_async()
        return collected

    trained = train.Trainer.train

    async def train_step(self: train.Trainer, training: Any, weighted: Any) -> Any:
        metrics = await trained(self, training, weighted)
        if reached(f"training:{self.step + 1}"):  # self.step moves on after training
            await wait_async()
        return metrics

    publish = checkpoints.publish

    def hooked_publish(target: Path, build: Callable[[Path], None]) -> Path:
        name = f"{target.parent.name}/{target.name}"

        def hooked_build(tmp: Path) -> None:
            build(tmp)
            if reached(f"checkpoint:{name}"):
                wait_sync()
            if name == disk_full_at:
                code = errno.ENOSPC
                raise OSError(code, os.strerror(code), str(tmp / "optimizer.pt"))

        return publish(target, hooked_build)

    loadable_state = run_base.loadable_state

    def resume_point(path: str, step: int) -> tuple[str, int]:
        if reached("resume"):
            wait_sync()
        return loadable_state(path, step)

    run_base.loadable_state = resume_point
    Collector.train_batch = sampled  # type: ignore[method-assign]
    train.Trainer.train = train_step  # type: ignore[method-assign]
    checkpoints.publish = hooked_publish
    return train.main()


if __name__ == "__main__":
    sys.exit(main())
