"""Crash safety with the real runner: a full disk at a checkpoint, and a run killed in each phase
or with a corrupted checkpoint resumes from the last complete one. The paused runner's checkpoint
hooks are in the run's process: the tests that use them run it with its engine there (private);
a real full disk reaches runs on the shared engine host too (the tmpfs case)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from core.checkpoint_check import STATE_KIND, check
from core.checkpoint_manifest import Verdict
from server.app import create_app
from tests import test_checkpoint_safety
from tests.support.helpers import finish_run as finish
from tests.support.helpers import start_run as start
from tests.support.helpers import wait_for
from tests.support.settings import make_settings
from tests.test_checkpoint_safety import TINY, damage, leftovers, logs, resume

# The fixture these tests share with tests/test_checkpoint_safety.py, bound here where pytest looks.
tmpfs_var = test_checkpoint_safety.tmpfs_var

PAUSED_RUNNER = "tests.support.fake_runners.paused_runner"


def fill(disk: Path, leave: int) -> Path:
    """A file that leaves only `leave` bytes free on `disk`."""
    stats = os.statvfs(disk)
    filler = disk / "filler"
    with filler.open("wb") as fh:
        fh.write(b"\0" * (stats.f_bavail * stats.f_frsize - leave))
    return filler


@pytest.mark.parametrize("how", ["tmpfs", "injected"])
def test_a_full_disk_at_a_checkpoint_fails_the_run_and_keeps_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, how: str
) -> None:
    overrides: dict[str, object] = {"runner_module": PAUSED_RUNNER, "stop_grace_s": 30.0}
    if how == "tmpfs":
        var = request.getfixturevalue("tmpfs_var")
        # Only the run folder on the small disk: the database and models stay on the big one.
        overrides["database_url"] = f"sqlite:///{tmp_path / 'rlcs.db'}"
        overrides["models_path"] = tmp_path / "models"
        monkeypatch.setenv("FAKE_PAUSE_AT", "training:4")
    else:
        monkeypatch.setenv("FAKE_DISK_FULL_AT", "step-000004/state")
        overrides["run_engine"] = "private"
    settings = make_settings(tmp_path, **overrides)
    with TestClient(create_app(settings)) as client:
        run_id = start(client, **TINY, total_steps=6, save_every=2)
        run_dir = settings.runs_dir / run_id
        filler = None
        if how == "tmpfs":
            wait_for((run_dir / "paused").exists, 120)
            # Less than the adapter file (80 KiB), more than the log lines before it.
            filler = fill(var, leave=32 << 10)
            (run_dir / "paused").unlink()
        run = finish(client, run_id)
        assert run["status"] == "failed" and run["failure_kind"] == "disk_full", run
        assert "disk is full" in run["error"] and "step-000004/state" in run["error"]
        checkpoints = run_dir / "checkpoints"
        assert check(checkpoints / "step-000002" / "state") == Verdict(True, True)
        assert check(checkpoints / "step-000002" / "sampler", "sampler") == Verdict(True, True)
        assert not (checkpoints / "step-000004").exists() and leftovers(checkpoints) == []

        # Space freed, the run resumes from that checkpoint and finishes.
        if filler is not None:
            filler.unlink()
        monkeypatch.delenv("FAKE_PAUSE_AT", raising=False)
        monkeypatch.delenv("FAKE_DISK_FULL_AT", raising=False)
        assert resume(client, run_id)["resume_step"] == 2
        done = finish(client, run_id)
        assert done["status"] == "succeeded" and done["step"] == 6, done
        # The runner gone (reaped), nothing holds the small disk at unmount.
        wait_for(lambda: client.get(f"/runs/{run_id}").json()["exit_code"] is not None)


def test_the_real_runner_killed_in_each_phase_resumes_from_its_last_complete_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(
        tmp_path, runner_module=PAUSED_RUNNER, stop_grace_s=30.0, run_engine="private"
    )
    points = ["sampling:3", "training:4", "checkpoint:step-000004/state"]
    with TestClient(create_app(settings)) as client:
        monkeypatch.setenv("FAKE_PAUSE_AT", points[0])
        run_id = start(client, **TINY, total_steps=6, save_every=2)
        run_dir = settings.runs_dir / run_id
        checkpoints = run_dir / "checkpoints"
        for attempt, point in enumerate(points, 1):
            if attempt > 1:
                monkeypatch.setenv("FAKE_PAUSE_AT", point)
                assert resume(client, run_id)["resume_step"] == 2, point
            wait_for((run_dir / "paused").exists, 120)
            os.kill(client.get(f"/runs/{run_id}").json()["pid"], signal.SIGKILL)
            run = finish(client, run_id)
            assert run["status"] == "failed" and run["failure_kind"] == "killed", (point, run)
            assert run["attempt"] == attempt and "SIGKILL" in run["error"], (point, run)
            assert check(checkpoints / "step-000002" / STATE_KIND) == Verdict(True, True)
            (run_dir / "paused").unlink()
        assert leftovers(checkpoints)  # the last kill was inside a checkpoint write
        monkeypatch.delenv("FAKE_PAUSE_AT")
        assert resume(client, run_id)["resume_step"] == 2
        done = finish(client, run_id)
        assert done["status"] == "succeeded" and done["step"] == 6, done
        assert f"resuming from {checkpoints}/step-000002/state at step 2" in logs(client, run_id)
        assert leftovers(checkpoints) == []
        assert check(checkpoints / "step-000006" / STATE_KIND) == Verdict(True, True)


def test_the_real_runner_skips_a_corrupted_checkpoint_and_resumes_from_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path, runner_module=PAUSED_RUNNER, stop_grace_s=30.0)
    with TestClient(create_app(settings)) as client:
        run_id = start(client, **TINY, total_steps=4, save_every=2)
        assert finish(client, run_id)["status"] == "succeeded"
        run_dir = settings.runs_dir / run_id
        newest = run_dir / "checkpoints" / "step-000004" / STATE_KIND

        # Damaged after the server chose it, before the runner loads it.
        monkeypatch.setenv("FAKE_PAUSE_AT", "resume")
        assert resume(client, run_id, total_steps=6, force=True)["resume_step"] == 4
        wait_for((run_dir / "paused").exists, 120)
        damage(newest / "adapter_model.safetensors", "flip")
        (run_dir / "paused").unlink()

        done = finish(client, run_id)
        text = logs(client, run_id)
        assert done["status"] == "succeeded" and done["step"] == 6, (done["error"], text)
        assert (
            f"skipping checkpoint {newest}: adapter_model.safetensors fails its sha256 check"
            in text
        )
        previous = newest.parent.parent / "step-000002" / STATE_KIND
        assert f"resuming from {previous} at step 2" in text
        assert "step 3/6" in text and "step 4/6" in text  # done again from the older checkpoint
