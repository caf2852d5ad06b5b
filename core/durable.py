"""Writes that survive a crash or power loss: a temporary name, fsync the file, rename, fsync the
folder. A reader sees the old content or the new, never a torn file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) durable; a rename alone is not."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """`mkdir -p`, with each folder it creates made durable in its parent."""
    path = Path(path)
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue  # made meanwhile by another writer; its parent entry is theirs to sync
        fsync_dir(folder.parent)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: a reader (or a restart after a crash) sees all or nothing."""
    path = Path(path)
    # The pid keeps two processes writing the same file from sharing a temporary name.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, data: Any) -> None:
    write_bytes_atomic(path, json.dumps(data, indent=2, sort_keys=True).encode())
