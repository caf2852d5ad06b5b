"""Tinker's names for models and checkpoints, and where they live here.

A session's id is its run's id, so a model id is `r-3f9c2a1b:train:0` (SDK 0.38 derives it
from the session and the client's sequence number) and a checkpoint path is
`tinker://r-3f9c2a1b:train:0/weights/<name>` (or `sampler_weights`), the folder
`<run folder>/tinker/train-0/<name>/state` (or `sampler`): one mapping, both ways, that holds
across restarts. A sampler's id is `r-3f9c2a1b:sample:<seq>`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.checkpoint_check import RECORDS, SAMPLER_KIND, SAMPLER_RECORD, STATE_KIND, STATE_RECORD

PREFIX = "tinker://"
MODEL_ID = re.compile(r"^(r-[0-9a-f]{8}):train:(\d{1,6})$")
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# save_weights_external: the adapter as a peft folder, for download (`tinker checkpoint
# download`); written as a sampler checkpoint is, in a folder of its own kind.
EXTERNAL_KIND = "external"
SEGMENTS = {
    "weights": STATE_KIND,
    "sampler_weights": SAMPLER_KIND,
    "external_weights": EXTERNAL_KIND,
}
KIND_SEGMENTS = {kind: segment for segment, kind in SEGMENTS.items()}
RECORD_FILES = {
    STATE_KIND: STATE_RECORD,
    SAMPLER_KIND: SAMPLER_RECORD,
    EXTERNAL_KIND: SAMPLER_RECORD,
}
# What the RestClient calls each kind (Checkpoint.checkpoint_type).
CHECKPOINT_TYPES = {STATE_KIND: "training", SAMPLER_KIND: "sampler", EXTERNAL_KIND: "external"}


@dataclass(frozen=True)
class CheckpointRef:
    session_id: str
    seq: int
    kind: str  # state or sampler
    name: str

    @property
    def model_id(self) -> str:
        return model_id(self.session_id, self.seq)

    @property
    def path(self) -> str:
        return f"{PREFIX}{self.model_id}/{KIND_SEGMENTS[self.kind]}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        """What the RestClient calls it: `weights/<name>` or `sampler_weights/<name>`."""
        return f"{KIND_SEGMENTS[self.kind]}/{self.name}"

    def folder(self, run_dir: Path) -> Path:
        return model_folder(run_dir, self.seq) / self.name / self.kind

    @property
    def record_file(self) -> str:
        return RECORD_FILES[self.kind]


def model_id(session_id: str, seq: int) -> str:
    return f"{session_id}:train:{seq}"


def sampler_id(session_id: str, seq: int) -> str:
    return f"{session_id}:sample:{seq}"


def parse_model_id(value: str) -> tuple[str, int] | None:
    match = MODEL_ID.match(value)
    return (match[1], int(match[2])) if match else None


def model_folder(run_dir: Path, seq: int) -> Path:
    """Where a model's checkpoints go: `<name>/state` and `<name>/sampler` under it."""
    return Path(run_dir) / "tinker" / f"train-{seq}"


def parse(path: str, field: str = "path") -> CheckpointRef:
    """A tinker:// checkpoint path of this server; ValueError naming `field` otherwise."""
    example = "tinker://r-3f9c2a1b:train:0/weights/000010"
    if not path.startswith(PREFIX):
        raise ValueError(f"{field}: {path[:120]!r} is not a tinker:// path (like {example})")
    parts = path[len(PREFIX) :].split("/")
    if len(parts) != 3 or parts[1] not in SEGMENTS:
        raise ValueError(
            f"{field}: {path[:120]!r} is not tinker://<model id>/weights/<name>, "
            f"tinker://<model id>/sampler_weights/<name> or "
            f"tinker://<model id>/external_weights/<name> (like {example})"
        )
    owner = parse_model_id(parts[0])
    if owner is None:
        raise ValueError(
            f"{field}: {parts[0][:80]!r} is not a model id of this server (like "
            "r-3f9c2a1b:train:0); it names checkpoints saved here only"
        )
    if not NAME.match(parts[2]) or ".." in parts[2]:
        raise ValueError(f"{field}: {parts[2][:80]!r} is not a checkpoint name")
    return CheckpointRef(owner[0], owner[1], SEGMENTS[parts[1]], parts[2])


def from_folder(session_id: str, folder: str) -> CheckpointRef | None:
    """The checkpoint a folder recorded for a session's run holds, if it is one of ours."""
    path = Path(folder)
    kind, name, model = path.name, path.parent.name, path.parent.parent.name
    if kind not in KIND_SEGMENTS or not model.startswith("train-"):
        return None
    seq = model.removeprefix("train-")
    return CheckpointRef(session_id, int(seq), kind, name) if seq.isdigit() else None


def read_record(folder: Path, kind: str | None) -> dict[str, Any]:
    """The record a checkpoint folder holds (`kind`'s, or whichever it has), {} if none reads;
    blocking (its callers run it in a thread)."""
    for name in [RECORDS[kind]] if kind else list(RECORDS.values()):
        try:
            return dict(json.loads((folder / name).read_text()))
        except (OSError, ValueError):
            continue
    return {}
