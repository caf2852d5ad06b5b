"""Checkpoint folders of the local backend: names, crash-safe publication, and their records.

`<checkpoint_dir>/<name>/state/` holds adapter + optimizer (for resume) and
`<checkpoint_dir>/<name>/sampler/` a peft adapter (for sampling); both carry a small JSON
record and a manifest (core.checkpoint_manifest) that is checked before either is loaded.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core import durable
from core.checkpoint_check import (
    MANIFEST_KEY,
    SAMPLER_KIND,
    SAMPLER_RECORD,
    STATE_KIND,
    STATE_RECORD,
    CheckpointUnusable,
    check,
    locate,
)
from core.checkpoint_manifest import MANIFEST_FILE, seal
from runners.engine.disk_full import DiskFull, disk_full_errno

__all__ = [
    "SAMPLER_KIND",
    "SAMPLER_RECORD",
    "STATE_KIND",
    "STATE_RECORD",
    "CheckpointUnusable",
    "DiskFull",
]

STATE_FORMAT, SAMPLER_FORMAT = "rlcs-local-state-v1", "rlcs-local-sampler-v1"

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
log = logging.getLogger(__name__)


def checkpoint_folder(checkpoint_dir: Path, name: str, kind: str) -> Path:
    """`<checkpoint_dir>/<name>/<kind>`; the name is checked so it can never leave the folder."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise ValueError(
            f"checkpoint name {name!r} is not allowed: use 1-128 letters, digits, '_', '-', '.' "
            "(not starting with '.' or '-')"
        )
    return Path(checkpoint_dir).resolve() / name / kind


def publish(target: Path, build: Callable[[Path], None]) -> Path:
    """Build a folder in a temp dir beside `target`, seal it with a manifest, then rename it
    into place (replacing an old one).

    After a crash `target` is the old complete folder or the new complete one: every file, the
    manifest and the folder are fsynced before the rename, the parent after it. A killed build
    leaves only its temp folder, which the next publish beside it removes (as it puts back an
    old folder left aside by a replacement killed between its two renames). A full disk raises
    DiskFull, with the temp folder removed and nothing else touched.
    """
    parent = target.parent
    durable.make_dirs(parent)
    _clear_leftovers(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-tmp-{os.getpid()}-", dir=parent))
    old: Path | None = None
    try:
        _build_sealed(tmp, build, target)
        if target.exists():
            old = parent / f".{target.name}-old-{os.getpid()}-{tmp.name.rsplit('-', 1)[-1]}"
            os.rename(target, old)
        try:
            os.rename(tmp, target)
        except OSError:
            if old is not None:  # the old folder goes back rather than being removed below
                os.rename(old, target)
                old = None
            raise
        durable.fsync_dir(parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        _remove_if_empty(parent)
    return target


def _build_sealed(tmp: Path, build: Callable[[Path], None], target: Path) -> None:
    """`build` into `tmp` and seal it; a full disk raises DiskFull naming `target`."""
    try:
        build(tmp)
        seal(tmp)
    except Exception as exc:
        code = disk_full_errno(exc, tmp)  # before the temp folder goes: it is evidence
        if code is not None:
            _release_files(exc)
            raise DiskFull(code, os.strerror(code), str(target)) from exc
        raise


def write_record(folder: Path, filename: str, record: dict[str, Any]) -> None:
    """The folder's JSON record. It says the folder is sealed with a manifest (publish writes
    that last), so a checkpoint whose manifest went missing is not taken for an old one."""
    record = {**record, MANIFEST_KEY: MANIFEST_FILE}
    (folder / filename).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def find_state(path: str | os.PathLike[str], verify: bool = True) -> tuple[Path, dict[str, Any]]:
    """The state folder `path` names and its record. With `verify`, CheckpointUnusable unless
    every file matches the manifest; one saved before manifests loads with a warning."""
    return _find(path, STATE_KIND, STATE_RECORD, verify)


def find_sampler(path: str | os.PathLike[str], verify: bool = True) -> tuple[Path, dict[str, Any]]:
    folder = Path(str(path)).expanduser()
    config = folder / "adapter_config.json"
    if not (folder / SAMPLER_RECORD).is_file() and config.is_file():
        # A peft adapter saved elsewhere: its config names the base model.
        base_model = json.loads(config.read_text()).get("base_model_name_or_path")
        if base_model:
            return folder, {"format": "peft", "base_model": base_model}
    return _find(path, SAMPLER_KIND, SAMPLER_RECORD, verify)


def _find(
    path: str | os.PathLike[str], kind: str, record: str, verify: bool
) -> tuple[Path, dict[str, Any]]:
    folder = locate(str(path), kind)
    record_path = folder / record
    if not record_path.is_file():
        raise FileNotFoundError(
            f"{path} is not a local {kind} checkpoint (no {record}); pass the path that "
            f"save_{'state' if kind == STATE_KIND else 'weights_for_sampler'} returned"
        )
    if verify:
        verdict = check(folder, kind)
        if not verdict.usable:
            log.warning("not loading checkpoint %s: %s", folder, verdict.reason)
            raise CheckpointUnusable(f"checkpoint {folder} cannot be loaded: {verdict.reason}")
        if not verdict.verified:
            log.warning("loading checkpoint %s unverified: %s", folder, verdict.reason)
    try:
        return folder, json.loads(record_path.read_text())
    except ValueError as exc:
        raise CheckpointUnusable(f"checkpoint {folder}: {record} is unreadable ({exc})") from exc


def _clear_leftovers(target: Path) -> None:
    """What a publish killed midway left beside `target`: its temp folder (removed), or, had it
    died between the two renames of a replacement, the old folder (put back if `target` is
    missing). Folders of a process still alive are its own business."""
    temp, old = f".{target.name}-tmp-", f".{target.name}-old-"
    for entry in target.parent.iterdir():
        prefix = (
            temp if entry.name.startswith(temp) else old if entry.name.startswith(old) else None
        )
        if prefix is None or _writer_alive(entry.name[len(prefix) :].split("-", 1)[0]):
            continue
        if prefix == old and not target.exists():
            os.rename(entry, target)
            durable.fsync_dir(target.parent)
            log.warning("put back %s, left aside by a replacement that did not finish", target)
        else:
            shutil.rmtree(entry, ignore_errors=True)
            log.info("removed %s, left by a checkpoint write that did not finish", entry)


def _writer_alive(pid_text: str) -> bool:
    if not pid_text.isdigit():
        return True  # not one of ours: leave it alone
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _release_files(exc: BaseException) -> None:
    """Drop the locals of the frames that raised `exc`: a writer that failed midway (torch.save)
    may still hold its file open there, and a deleted file's space comes back only once closed."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


def _remove_if_empty(folder: Path) -> None:
    """A failed first publish into `<name>/` leaves no empty `<name>/` to look half written."""
    try:
        folder.rmdir()
    except OSError:
        pass
