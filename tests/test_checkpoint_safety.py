"""Crash safety of the files a run leaves: a SIGKILL or a full disk in the middle of a checkpoint
leaves the previous one loadable, a damaged checkpoint is skipped on resume, and a run killed at
any point resumes from its last complete checkpoint. Real processes throughout."""

from __future__ import annotations

import json
import os
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


# ----- kill -9 at any point ---------------------------------------------------------------
