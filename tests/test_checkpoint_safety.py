"""Crash safety of the files a run leaves: a SIGKILL or a full disk in the middle of a checkpoint
leaves the previous one loadable, a damaged checkpoint is skipped on resume, and a run killed at
any point resumes from its last complete checkpoint. Real processes throughout."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from core.checkpoint_check import STATE_KIND, check, pick_resume
from core.checkpoint_manifest import MANIFEST_FILE, Verdict
from core.run_folder import RunFolder
from core.settings import PROJECT_ROOT
from runners.engine.checkpoints import find_state, publish
from server.app import create_app
from tests.support.fake_runners import publisher
from tests.support.helpers import TINY_RUN, small_tmpfs, wait_for
from tests.support.helpers import finish_run as finish
from tests.support.helpers import start_run as start
from tests.support.settings import make_settings

CHECKPOINTING = "tests.support.fake_runners.checkpointing"
PAUSED_RUNNER = "tests.support.fake_runners.paused_runner"
TINY = {**TINY_RUN, "environment": "arithmetic", "steps_per_eval": 0}


def resume(client: TestClient, run_id: str, **body: object) -> dict:
    resp = client.post(f"/runs/{run_id}/resume", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def logs(client: TestClient, run_id: str) -> str:
    return "\n".join(client.get(f"/runs/{run_id}/logs", params={"tail": 400}).json()["lines"])


def leftovers(checkpoint_dir: Path) -> list[str]:
    """Temp or aside folders a checkpoint write left (their names start with a dot)."""
    return sorted(str(p) for p in checkpoint_dir.rglob(".*"))


# ----- the files themselves ---------------------------------------------------------------


def test_the_checkpoint_index_is_rewritten_whole(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    # A torn last line, as an append cut short by a crash (before writes were atomic) left it.
    folder.checkpoints.write_text(json.dumps({"step": 2}) + '\n{"step": 4, "na')
    folder.append_checkpoint({"step": 4})
    assert folder.checkpoints.read_text() == '{"step": 2}\n{"step": 4}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoints.jsonl"]  # no temp file left


@pytest.mark.parametrize("point", ["mid-file", "unsealed", "sealed"])
def test_sigkill_in_the_middle_of_a_checkpoint_leaves_the_previous_one_loadable(
    tmp_path: Path, point: str
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_runners.publisher", str(tmp_path), point],
        cwd=PROJECT_ROOT,
    )
    try:
        wait_for(lambda: (tmp_path / "paused").exists() or child.poll() is not None, 60)
        assert child.poll() is None, f"the publisher exited ({child.returncode}) before pausing"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    half = tmp_path / "step-000002"
    assert not (half / STATE_KIND).exists()
    [temp] = half.iterdir()  # what the killed write left: its temp folder
    assert temp.name.startswith(f".state-tmp-{child.pid}-")
    assert (temp / MANIFEST_FILE).exists() == (point == "sealed")

    pick = pick_resume(str(half / STATE_KIND), 2)
    assert pick.step == 1 and pick.verdict == Verdict(True, True)
    assert pick.skipped[0][0] == str(half / STATE_KIND)
    folder, record = find_state(pick.path)
    assert record["step"] == 1
    assert (folder / publisher.WEIGHTS).read_bytes() == publisher.weights(1) * 2

    # The next write of that checkpoint clears what the killed one left.
    publish(half / STATE_KIND, publisher.build(2, None, lambda: None))
    assert check(half / STATE_KIND) == Verdict(True, True)
    assert leftovers(tmp_path) == []


# ----- a damaged checkpoint on resume -----------------------------------------------------


@pytest.fixture
def fake_client(tmp_path: Path) -> Iterator[TestClient]:
    settings = make_settings(tmp_path, runner_module=CHECKPOINTING, max_concurrent_runs=10)
    with TestClient(create_app(settings)) as client:
        yield client


def damage(path: Path, how: str) -> None:
    if how == "flip":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01  # one bit: the file still parses, its hash does not match
        path.write_bytes(bytes(data))
    else:
        os.truncate(path, 1000)


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_resume_skips_a_checkpoint_that_fails_its_manifest(
    fake_client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    run_id = start(fake_client, **TINY, total_steps=4, seed=1)
    assert finish(fake_client, run_id)["status"] == "succeeded"
    run_dir = tmp_path / "var" / "runs" / run_id
    newest = run_dir / "checkpoints" / "step-000003" / STATE_KIND

    # Damaged after the server chose it, before the runner loads it.
    monkeypatch.setenv("FAKE_PAUSE_AT", json.dumps({"1": "resume"}))
    assert resume(fake_client, run_id)["resume_step"] == 3
    wait_for((run_dir / "paused").exists, 60)
    damage(newest / "payload.bin", how)
    (run_dir / "paused").unlink()

    done = finish(fake_client, run_id)
    text = logs(fake_client, run_id)
    assert done["status"] == "succeeded" and done["step"] == 4, (done["error"], text)
    why = "fails its sha256 check" if how == "flip" else "is 1000 bytes"
    assert f"skipping checkpoint {newest}: payload.bin {why}" in text
    previous = newest.parent.parent / "step-000002" / STATE_KIND
    assert f"falling back to checkpoint {previous} (step 2)" in text
    assert f"resumed from {previous} at step 2" in text
    # Step 3, recorded by the first attempt, was done again: its metrics are in once.
    rows = fake_client.get(f"/runs/{run_id}/history").json()["rows"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


def test_the_server_resumes_from_the_newest_checkpoint_that_passes(
    fake_client: TestClient, tmp_path: Path
) -> None:
    run_id = start(fake_client, **TINY, total_steps=4, seed=1)
    assert finish(fake_client, run_id)["status"] == "succeeded"
    checkpoints = tmp_path / "var" / "runs" / run_id / "checkpoints"
    damage(checkpoints / "step-000003" / STATE_KIND / "payload.bin", "flip")
    named = fake_client.post(f"/runs/{run_id}/resume", json={"checkpoint_step": 3})
    assert named.status_code == 409 and "cannot be loaded" in named.json()["detail"]
    assert resume(fake_client, run_id)["resume_step"] == 2  # step 3 was passed over
    assert finish(fake_client, run_id)["status"] == "succeeded"


# ----- a full disk ------------------------------------------------------------------------


def test_a_full_disk_is_classified_with_an_actionable_reason() -> None:
    import errno
    import sqlite3

    from runners.engine.checkpoints import DiskFull
    from runners.train.loop import classify

    kind, reason = classify(DiskFull(errno.ENOSPC, "No space left on device", "/ck/step-4/state"))
    assert kind == "disk_full"
    assert "/ck/step-4/state" in reason and "Free space" in reason and "resume" in reason
    kind, _ = classify(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert kind == "disk_full"
    kind, _ = classify(sqlite3.OperationalError("database or disk is full"))
    assert kind == "disk_full"
    assert classify(OSError(errno.EACCES, "Permission denied"))[0] == "error"


@pytest.fixture
def tmpfs_var(tmp_path: Path) -> Iterator[Path]:
    """var_dir (run folders, checkpoints, logs) on a real 8 MiB tmpfs; skipped where mount is
    refused (needs root or CAP_SYS_ADMIN)."""
    with small_tmpfs(tmp_path / "var", "8m") as var:
        yield var


def fill(disk: Path, leave: int) -> Path:
    """A file that leaves only `leave` bytes free on `disk`."""
    stats = os.statvfs(disk)
    filler = disk / "filler"
    with filler.open("wb") as fh:
        fh.write(b"\0" * (stats.f_bavail * stats.f_frsize - leave))
    return filler


@pytest.mark.training
@pytest.mark.slow
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


# ----- kill -9 at any point ---------------------------------------------------------------


def kill_point(seed: int, total: int, chunks: int) -> tuple[str, int]:
    """Where seed `seed` pauses the fake (sampling, training or inside a checkpoint write; each
    phase comes up) and the last complete checkpoint's step at that point."""
    rng = random.Random(seed)
    phase = ("sampling", "training", "checkpoint")[seed % 3]
    step = rng.randint(2, total - 1)  # a checkpoint exists by then
    if phase == "checkpoint":
        return f"checkpoint:{step}:{rng.randint(0, chunks)}", step - 1
    return f"{phase}:{step}", step - 1


@pytest.mark.slow
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


@pytest.mark.training
@pytest.mark.slow
def test_the_real_runner_killed_in_each_phase_resumes_from_its_last_complete_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path, runner_module=PAUSED_RUNNER, stop_grace_s=30.0)
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


@pytest.mark.training
@pytest.mark.slow
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
