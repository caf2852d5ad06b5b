"""A run's folder (var/runs/<run_id>/) as both sides know it: its files, written so that a crash
leaves each whole (core.durable). Also the config hash and the metric values a run may record."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from core import durable
from core.spec import ResumePoint, RunSpec

CONFIG_FILE = "config.json"  # the RunSpec, frozen by the server before the run starts
LOG_FILE = "train.log"  # the runner's stdout and stderr
RESUME_FILE = "resume.json"  # a ResumePoint, written by a resume
CHECKPOINTS_FILE = "checkpoints.jsonl"  # one line per checkpoint the runner saved


class RunFolder:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @property
    def log(self) -> Path:
        return self.path / LOG_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_FILE

    def create(self, spec: RunSpec) -> None:
        """The folder, its frozen spec and an empty log; fails if the folder exists."""
        durable.make_dirs(self.path.parent)
        self.path.mkdir(exist_ok=False)
        self.write_spec(spec)
        self.log.touch()
        durable.fsync_dir(self.path)  # the log's entry; the spec's was synced by its rename
        durable.fsync_dir(self.path.parent)  # the folder itself

    def adopt_carried(self, spec_json: str | None, resume_json: str | None) -> None:
        """Lay out this folder from what a job carried (its spec, and its resume point on a
        later attempt; core.settings: run_spec, resume_point), so the runner needs nothing from
        the server's disk. The carried files win: the folder may hold an older attempt's."""
        if spec_json is None:
            return
        durable.make_dirs(self.path)
        self.write_spec(RunSpec.model_validate_json(spec_json))
        if resume_json is not None:
            self.write_resume(ResumePoint.model_validate_json(resume_json))

    def write_spec(self, spec: RunSpec) -> None:
        write_json_atomic(self.path / CONFIG_FILE, spec.model_dump(mode="json", exclude_none=True))

    def spec(self) -> RunSpec:
        return RunSpec.model_validate_json((self.path / CONFIG_FILE).read_text())

    def write_resume(self, point: ResumePoint) -> None:
        write_json_atomic(self.path / RESUME_FILE, point.model_dump(mode="json"))

    def clear_resume(self) -> None:
        (self.path / RESUME_FILE).unlink(missing_ok=True)

    def resume_point(self) -> ResumePoint | None:
        try:
            return ResumePoint.model_validate_json((self.path / RESUME_FILE).read_text())
        except FileNotFoundError:
            return None

    def append_checkpoint(self, record: dict[str, Any]) -> None:
        """Add a line to the index by rewriting it whole (it is small): an append cut short by
        a crash would leave a torn last line."""
        lines = [json.dumps(r) for r in self.checkpoint_records()]
        lines.append(json.dumps(record))
        durable.write_bytes_atomic(self.checkpoints, ("\n".join(lines) + "\n").encode())

    def checkpoint_records(self) -> list[dict[str, Any]]:
        """The index's records; a torn line (left by an append before writes were atomic) is
        dropped."""
        try:
            text = self.checkpoints.read_text()
        except FileNotFoundError:
            return []
        records = []
        for line in text.splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def log_tail(self, count: int) -> list[str]:
        return tail_lines(self.log, count)


def hash_config(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    durable.write_json_atomic(path, data)


def tail_lines(path: Path, count: int, max_bytes: int = 1 << 20) -> list[str]:
    """The last `count` lines of a file, reading at most `max_bytes` from its end."""
    if count <= 0:
        return []
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except FileNotFoundError:
        return []
    return log_lines(data.decode("utf-8", errors="replace"))[-count:]


def log_lines(text: str) -> list[str]:
    """A log's lines: each ends at LF (a CR right before it is part of a CRLF ending); a bare CR
    stays inside its line, where progress bars write it to redraw."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the text ended with a line end, or was empty
    return [line.removesuffix("\r") for line in lines]


def clean_metrics(metrics: dict[str, Any]) -> dict[str, float | None]:
    """JSON-safe metric values: numbers as float, NaN and infinities as null."""
    out: dict[str, float | None] = {}
    for key, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        out[key] = number if math.isfinite(number) else None
    return out
