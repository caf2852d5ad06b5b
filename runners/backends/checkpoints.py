"""Checkpoint folders of the local backend: names, atomic publication, and their JSON records.

`<checkpoint_dir>/<name>/state/` holds adapter + optimizer (for resume) and
`<checkpoint_dir>/<name>/sampler/` a peft adapter (for sampling); both carry a small JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATE_KIND, SAMPLER_KIND = "state", "sampler"
STATE_RECORD, SAMPLER_RECORD = "rlcs_state.json", "rlcs_sampler.json"
STATE_FORMAT, SAMPLER_FORMAT = "rlcs-local-state-v1", "rlcs-local-sampler-v1"

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def checkpoint_folder(checkpoint_dir: Path, name: str, kind: str) -> Path:
    """`<checkpoint_dir>/<name>/<kind>`; the name is checked so it can never leave the folder."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise ValueError(
            f"checkpoint name {name!r} is not allowed: use 1-128 letters, digits, '_', '-', '.' "
            "(not starting with '.' or '-')"
        )
    return Path(checkpoint_dir).resolve() / name / kind


def publish(target: Path, build: Callable[[Path], None]) -> Path:
    """Build a folder in a temp dir beside `target`, then swap it in (replacing an old one).

    A reader never sees a half-written checkpoint: the folder appears by rename.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    old: Path | None = None
    try:
        build(tmp)
        if target.exists():
            old = target.with_name(f".{target.name}-old-{os.getpid()}-{id(tmp)}")
            os.rename(target, old)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def write_record(folder: Path, filename: str, record: dict[str, Any]) -> None:
    (folder / filename).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _find(path: str | os.PathLike[str], kind: str, record: str) -> tuple[Path, dict[str, Any]]:
    folder = Path(str(path).removeprefix("local://")).expanduser()
    # Accept the checkpoint's parent folder too (`<checkpoint_dir>/<name>`).
    if not (folder / record).is_file() and (folder / kind / record).is_file():
        folder = folder / kind
    record_path = folder / record
    if not record_path.is_file():
        raise FileNotFoundError(
            f"{path} is not a local {kind} checkpoint (no {record}); pass the path that "
            f"save_{'state' if kind == STATE_KIND else 'weights_for_sampler'} returned"
        )
    return folder, json.loads(record_path.read_text())


def find_state(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    return _find(path, STATE_KIND, STATE_RECORD)


def find_sampler(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    folder = Path(str(path)).expanduser()
    config = folder / "adapter_config.json"
    if not (folder / SAMPLER_RECORD).is_file() and config.is_file():
        # A peft adapter saved elsewhere: its config names the base model.
        base_model = json.loads(config.read_text()).get("base_model_name_or_path")
        if base_model:
            return folder, {"format": "peft", "base_model": base_model}
    return _find(path, SAMPLER_KIND, SAMPLER_RECORD)
