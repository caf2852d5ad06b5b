"""How many bytes a checkpoint folder holds (the RestClient's size_bytes, billing's storage)."""

from __future__ import annotations

from pathlib import Path


def folder_bytes(folder: Path) -> int | None:
    """The bytes of the files directly in `folder`; None when it cannot be read."""
    try:
        return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    except OSError:
        return None
