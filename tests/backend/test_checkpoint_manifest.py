"""Checkpoint folders on disk: sealed with a manifest, checked before anything loads them, a
resume falling back past a bad one, a full disk leaving the last good one as it was."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.checkpoint_check import (
    CheckpointUnusable,
    check,
    first_usable,
    pick_resume,
)
from core.checkpoint_manifest import MANIFEST_FILE, Verdict
from runners.engine.checkpoints import (
    STATE_FORMAT,
    STATE_KIND,
    STATE_RECORD,
    DiskFull,
    checkpoint_folder,
    find_state,
    publish,
    write_record,
)
from tests.support.helpers import small_tmpfs

PAYLOAD = b"weights " * 1000


def files(step: int, payload: bytes = PAYLOAD) -> Callable[[Path], None]:
    def build(tmp: Path) -> None:
        (tmp / "weights.bin").write_bytes(payload)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "notes.txt").write_text(f"step {step}")
        write_record(tmp, STATE_RECORD, {"format": STATE_FORMAT, "step": step})

    return build


def save(checkpoint_dir: Path, step: int, build: Callable[[Path], None] | None = None) -> Path:
    target = checkpoint_folder(checkpoint_dir, f"step-{step:06d}", STATE_KIND)
    return publish(target, build or files(step))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_publish_seals_every_file_and_find_state_checks_them(tmp_path: Path) -> None:
    folder = save(tmp_path, 1)
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert set(manifest["files"]) == {"weights.bin", "sub/notes.txt", STATE_RECORD}
    entry = manifest["files"]["weights.bin"]
    assert entry == {"size": len(PAYLOAD), "sha256": hashlib.sha256(PAYLOAD).hexdigest()}
    assert check(folder) == Verdict(True, True)
    found, record = find_state(folder.parent)  # the checkpoint's parent folder names it too
    assert found == folder and record["step"] == 1
    assert [p.name for p in folder.parent.iterdir()] == [STATE_KIND]  # no temp folder left


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("flip", "weights.bin fails its sha256 check"),
        ("truncate", "weights.bin is 4000 bytes, its manifest says 8000"),
        ("remove_file", "sub/notes.txt is missing"),
        ("remove_manifest", "half written: rlcs_manifest.json is missing"),
        ("garble_manifest", "rlcs_manifest.json is unreadable"),
        ("remove_record", "no rlcs_state.json"),
    ],
)
def test_a_damaged_checkpoint_is_refused_saying_why(
    tmp_path: Path, damage: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = save(tmp_path, 1)
    weights = folder / "weights.bin"
    if damage == "flip":
        data = bytearray(weights.read_bytes())
        data[1234] ^= 0x01
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        os.truncate(weights, 4000)
    elif damage == "remove_file":
        (folder / "sub" / "notes.txt").unlink()
    elif damage == "remove_manifest":
        (folder / MANIFEST_FILE).unlink()
    elif damage == "garble_manifest":
        (folder / MANIFEST_FILE).write_text('{"files": ')
    else:
        (folder / STATE_RECORD).unlink()
    verdict = check(folder)
    assert not verdict.usable and reason in verdict.reason, verdict
    with pytest.raises((CheckpointUnusable, FileNotFoundError)):
        find_state(folder)
    if damage != "remove_record":  # that one is not a checkpoint at all, as before
        assert f"not loading checkpoint {folder}: {verdict.reason}" in caplog.text


def test_a_checkpoint_from_before_manifests_loads_unverified(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = save(tmp_path, 1)
    (folder / MANIFEST_FILE).unlink()
    record = json.loads((folder / STATE_RECORD).read_text())
    del record["manifest"]
    (folder / STATE_RECORD).write_text(json.dumps(record))
    verdict = check(folder)
    assert verdict.usable and not verdict.verified and "no rlcs_manifest.json" in verdict.reason
    _, loaded = find_state(folder)
    assert loaded["step"] == 1
    assert f"loading checkpoint {folder} unverified" in caplog.text


def test_resume_falls_back_to_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save(tmp_path, step)
    os.truncate(tmp_path / "step-000003" / STATE_KIND / "weights.bin", 10)
    # A publish killed at once: the temp folder only.
    (tmp_path / "step-000004" / f".state-tmp-{dead_pid()}-x").mkdir(parents=True)
    pick = pick_resume(str(tmp_path / "step-000004" / STATE_KIND), 4)
    assert (pick.path, pick.step) == (str(tmp_path / "step-000002" / STATE_KIND), 2)
    assert pick.verdict.verified
    assert [(Path(p).parent.name, why.split(" ")[-1]) for p, why in pick.skipped] == [
        ("step-000004", "written)"),
        ("step-000003", "(truncated?)"),
    ]
    # Asked for an older step, newer checkpoints are never candidates.
    assert pick_resume(str(tmp_path / "step-000001" / STATE_KIND), 1).step == 1
    for step in (1, 2):
        os.truncate(tmp_path / f"step-00000{step}" / STATE_KIND / "weights.bin", 10)
    with pytest.raises(CheckpointUnusable, match="step-000001/state: weights.bin is 10 bytes"):
        pick_resume(str(tmp_path / "step-000003" / STATE_KIND), 3)


def test_first_usable_picks_from_database_rows(tmp_path: Path) -> None:
    """What the server's resume does with its Checkpoint rows, newest first."""
    rows = [SimpleNamespace(step=s, path=str(save(tmp_path, s))) for s in (3, 2, 1)]
    (Path(rows[0].path) / "weights.bin").write_bytes(b"not the weights")
    row, skipped = first_usable(rows, lambda r: r.path)
    assert row is rows[1] and skipped == [(rows[0].path, skipped[0][1])]
    assert "weights.bin" in skipped[0][1]
    hosted = [SimpleNamespace(path="tinker://abc/weights/step-3")]
    assert first_usable(hosted, lambda r: r.path) == (hosted[0], [])


def test_leftovers_of_a_killed_publish_are_cleared_and_the_old_folder_put_back(
    tmp_path: Path,
) -> None:
    folder = save(tmp_path, 1)
    parent = folder.parent
    stale = parent / f".state-tmp-{dead_pid()}-abc"
    stale.mkdir()
    (stale / "weights.bin").write_bytes(b"half")
    live = parent / f".state-tmp-{os.getppid()}-def"  # a writer still alive: not ours to remove
    live.mkdir()
    save(tmp_path, 1)
    assert not stale.exists() and live.exists()
    live.rmdir()

    # Killed between the two renames of a replacement: the old folder is aside, none in place.
    aside = parent / f".state-old-{dead_pid()}-xyz"
    os.rename(folder, aside)

    def fails(tmp: Path) -> None:
        raise RuntimeError("the new checkpoint could not be built")

    with pytest.raises(RuntimeError, match="could not be built"):
        save(tmp_path, 1, fails)
    assert not aside.exists() and check(folder) == Verdict(True, True)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), errno.EDQUOT),
        # How safetensors reports it: its own error type, the errno only in the text.
        (
            RuntimeError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            ),
            errno.ENOSPC,
        ),
    ],
)
def test_a_full_disk_raises_disk_full_and_keeps_the_previous_checkpoint(
    tmp_path: Path, error: Exception, code: int
) -> None:
    previous = save(tmp_path, 1)

    def build(tmp: Path) -> None:
        (tmp / "weights.bin").write_bytes(PAYLOAD)
        raise error

    with pytest.raises(DiskFull) as caught:
        save(tmp_path, 2, build)
    assert caught.value.errno == code and caught.value.__cause__ is error
    assert caught.value.filename == str(tmp_path.resolve() / "step-000002" / STATE_KIND)
    assert not (tmp_path / "step-000002").exists()  # no temp folder, no empty folder either
    assert check(previous) == Verdict(True, True)


def test_other_build_errors_are_not_taken_for_a_full_disk(tmp_path: Path) -> None:
    def build(tmp: Path) -> None:
        raise ValueError("a tensor of the wrong shape")

    with pytest.raises(ValueError, match="wrong shape"):
        save(tmp_path, 1, build)
    assert not (tmp_path / "step-000001").exists()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (needs root or CAP_SYS_ADMIN; skipped where mount is refused)."""
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        yield disk


@pytest.mark.parametrize("writer", ["torch.save", "safetensors"])
def test_a_really_full_disk_raises_disk_full(small_disk: Path, writer: str) -> None:
    import torch
    from safetensors.torch import save_file

    previous = save(small_disk, 1)
    big = {"t": torch.zeros(1 << 20)}  # 4 MiB on a 1 MiB disk

    def build(tmp: Path) -> None:
        if writer == "torch.save":
            torch.save(big, tmp / "optimizer.pt")  # a RuntimeError with no errno in it
        else:
            save_file(big, str(tmp / "adapter_model.safetensors"))

    with pytest.raises(DiskFull) as caught:
        save(small_disk, 2, build)
    assert caught.value.errno == errno.ENOSPC
    assert not (small_disk / "step-000002").exists()
    assert check(previous) == Verdict(True, True)
    assert os.statvfs(small_disk).f_bfree > 200  # pages: the temp folder's space came back


def test_the_local_backend_never_loads_a_corrupted_checkpoint(
    service, trainer, caplog: pytest.LogCaptureFixture
) -> None:
    state = trainer.save_state("step-000001").result().path
    sampler = trainer.save_weights_for_sampler("step-000001").result().path
    optimizer = Path(state) / "optimizer.pt"
    data = bytearray(optimizer.read_bytes())
    data[-100] ^= 0xFF
    optimizer.write_bytes(bytes(data))
    with pytest.raises(CheckpointUnusable, match="optimizer.pt fails its sha256 check"):
        service.create_training_client_from_state_with_optimizer(state).result(timeout=60)
    with pytest.raises(CheckpointUnusable, match="optimizer.pt"):
        trainer.load_state(state).result(timeout=60)
    os.truncate(Path(sampler) / "adapter_model.safetensors", 100)
    with pytest.raises(CheckpointUnusable, match="adapter_model.safetensors is 100 bytes"):
        service.create_sampling_client(model_path=sampler)
    assert f"not loading checkpoint {state}" in caplog.text

    # The same checkpoint as saved before manifests (no manifest, nothing damaged): it loads.
    fresh = trainer.save_state("step-000002").result().path
    (Path(fresh) / MANIFEST_FILE).unlink()
    record_path = Path(fresh) / STATE_RECORD
    record = json.loads(record_path.read_text())
    del record["manifest"]
    record_path.write_text(json.dumps(record))
    resumed = service.create_training_client_from_state_with_optimizer(fresh).result(timeout=60)
    assert resumed.steps == trainer.steps
    assert f"loading checkpoint {fresh} unverified" in caplog.text
