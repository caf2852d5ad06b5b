"""Crash safety of checkpoints: SIGKILL at random points of a fake runner's checkpoint, then
resume from the last complete one."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from core.checkpoint_check import STATE_KIND, check
from server.app import create_app
from tests.support.helpers import finish_run as finish
from tests.support.helpers import start_run as start
from tests.support.helpers import wait_for
from tests.support.settings import make_settings
from tests.test_checkpoint_safety import CHECKPOINTING, TINY, leftovers, logs, resume


def kill_point(seed: int, total: int, chunks: int) -> tuple[str, int]:
    """Where seed `seed` pauses the fake (sampling, training or inside a checkpoint write; each
    phase comes up) and the last complete checkpoint's step at that point."""
    rng = random.Random(seed)
    phase = ("sampling", "training", "checkpoint")[seed % 3]
    step = rng.randint(2, total - 1)  # a checkpoint exists by then
    if phase == "checkpoint":
        return f"checkpoint:{step}:{rng.randint(0, chunks)}", step - 1
    return f"{phase}:{step}", step - 1


def test_kill_9_at_random_points_then_resume_from_the_last_complete_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeds, total, chunks = range(10), 6, 4
    plan = {seed: kill_point(seed, total, chunks) for seed in seeds}
    monkeypatch.setenv("FAKE_PAUSE_AT", json.dumps({str(s): p for s, (p, _) in plan.items()}))
    monkeypatch.setenv("FAKE_CHUNKS", str(chunks))
    settings = make_settings(tmp_path, runner_module=CHECKPOINTING, max_concurrent_runs=10)
    with TestClient(create_app(settings)) as client:
        runs = {seed: start(client, **TINY, total_steps=total, seed=seed) for seed in seeds}
        for run_id in runs.values():
            run_dir = settings.runs_dir / run_id
            wait_for((run_dir / "paused").exists, 60)
            os.kill(client.get(f"/runs/{run_id}").json()["pid"], signal.SIGKILL)
        for seed, run_id in runs.items():
            point, last = plan[seed]
            run = finish(client, run_id, 30)
            assert run["status"] == "failed" and run["failure_kind"] == "killed", (point, run)
            assert "SIGKILL" in run["error"], (point, run)
            checkpoints = settings.runs_dir / run_id / "checkpoints"
            assert check(checkpoints / f"step-{last:06d}" / STATE_KIND).verified, point
            (settings.runs_dir / run_id / "paused").unlink()
        monkeypatch.setenv("FAKE_PAUSE_AT", "{}")
        for seed, run_id in runs.items():
            point, last = plan[seed]
            assert resume(client, run_id)["resume_step"] == last, point
        for seed, run_id in runs.items():
            point, last = plan[seed]
            done = finish(client, run_id, 30)
            assert done["status"] == "succeeded" and done["step"] == total, (point, done)
            text = logs(client, run_id)
            assert "skipping checkpoint" not in text, (point, text)
            run_dir = settings.runs_dir / run_id
            assert f"resumed from {run_dir}/checkpoints/step-{last:06d}/state" in text, point
            assert leftovers(run_dir / "checkpoints") == [], point
