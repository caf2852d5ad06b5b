"""A checkpoint folder's manifest: the name, size and sha256 of every file in it, written last,
so a half-written or corrupted checkpoint is found before anything loads it."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import durable

MANIFEST_FILE = "rlcs_manifest.json"
MANIFEST_FORMAT = "rlcs-manifest-v1"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Verdict:
    """What a check found: a `usable` checkpoint may be loaded, a `verified` one matched its
    manifest; `reason` says why it is not usable or not verified ("" when verified)."""

    usable: bool
    verified: bool
    reason: str = ""


def seal(folder: Path) -> dict[str, Any]:
    """Hash and fsync every file of `folder`, then write its manifest atomically, last."""
    files: dict[str, dict[str, Any]] = {}
    for path in _files(folder):
        with path.open("rb") as fh:
            digest = hashlib.sha256()
            size = 0
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
            # Read-only descriptors flush the file's dirty pages too (fsync is per inode).
            os.fsync(fh.fileno())
        files[path.relative_to(folder).as_posix()] = {"size": size, "sha256": digest.hexdigest()}
    for sub in sorted({p.parent for p in _files(folder)} - {folder}):
        durable.fsync_dir(sub)
    manifest = {"format": MANIFEST_FORMAT, "files": files}
    durable.write_json_atomic(folder / MANIFEST_FILE, manifest)
    return manifest


def verify(folder: Path, required: bool) -> Verdict:
    """Check `folder` against its manifest. `required`: its writer wrote one (so a missing
    manifest means the folder is half written, not old)."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        if required:
            return Verdict(False, False, f"half written: {MANIFEST_FILE} is missing")
        return Verdict(True, False, f"no {MANIFEST_FILE} (saved before checkpoints had one)")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError(f"not a {MANIFEST_FORMAT} manifest")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Verdict(False, False, f"{MANIFEST_FILE} is unreadable ({exc})")
    for name, entry in sorted(files.items()):
        problem = _check_file(folder, name, entry)
        if problem:
            return Verdict(False, False, problem)
    return Verdict(True, True)


def _check_file(folder: Path, name: str, entry: Any) -> str | None:
    if not isinstance(entry, dict) or Path(name).is_absolute() or ".." in Path(name).parts:
        return f"{MANIFEST_FILE} has a bad entry for {name!r}"
    path = folder / name
    if not path.is_file():
        return f"{name} is missing"
    size = path.stat().st_size
    if size != entry.get("size"):
        return f"{name} is {size} bytes, its manifest says {entry.get('size')} (truncated?)"
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != entry.get("sha256"):
        return f"{name} fails its sha256 check (corrupted)"
    return None


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
