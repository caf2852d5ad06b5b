"""Which local checkpoint may be loaded: a folder's record and manifest are checked before
anything reads its weights, and a resume falls back to the newest earlier checkpoint that
passes. Layout: `<checkpoint_dir>/<name>/state/` and `<checkpoint_dir>/<name>/sampler/`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from core.checkpoint_manifest import Verdict, verify
from core.failures import RunFailure

STATE_KIND, SAMPLER_KIND = "state", "sampler"
STATE_RECORD, SAMPLER_RECORD = "rlcs_state.json", "rlcs_sampler.json"
RECORDS = {STATE_KIND: STATE_RECORD, SAMPLER_KIND: SAMPLER_RECORD}
# The record of a folder sealed with a manifest says so, so a lost manifest is not taken for
# an old checkpoint.
MANIFEST_KEY = "manifest"
_STEP_NAME = re.compile(r"^step-(\d+)$")
T = TypeVar("T")


class CheckpointUnusable(RunFailure, ValueError):
    """A checkpoint that must not be loaded (half written or corrupted), or none left to use."""

    category = "checkpoint"

    def reason(self) -> str:
        return (
            f"{self}. Resume from an earlier checkpoint (checkpoint_step), or point resume_from "
            "at another one."
        )


@dataclass(frozen=True)
class Pick:
    """The checkpoint a resume loads, and the newer ones it passed over with why."""

    path: str
    step: int
    verdict: Verdict
    skipped: list[tuple[str, str]] = field(default_factory=list)


def is_remote(path: str | Path) -> bool:
    """A hosted (tinker://) checkpoint: its service checks it, nothing here can."""
    return str(path).startswith("tinker://")


def locate(path: str | Path, kind: str) -> Path:
    """The folder a local checkpoint path names: the `<kind>` folder itself, or its parent
    `<checkpoint_dir>/<name>` (a `local://` prefix is allowed)."""
    folder = Path(str(path).removeprefix("local://")).expanduser()
    if not (folder / RECORDS[kind]).is_file() and (folder / kind).is_dir():
        folder = folder / kind
    return folder


def check(path: str | Path, kind: str = STATE_KIND) -> Verdict:
    """May this checkpoint be loaded? Hashes every file, so call it once per load."""
    if is_remote(path):
        return Verdict(True, False, "a hosted checkpoint (its service checks it)")
    folder = locate(path, kind)
    if not folder.is_dir():
        return Verdict(False, False, f"{folder} does not exist (never written, or half written)")
    record_path = folder / RECORDS[kind]
    if not record_path.is_file():
        why = f"half written, or not a {kind} checkpoint: no {record_path.name}"
        return Verdict(False, False, why)
    try:
        record = json.loads(record_path.read_text())
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        return Verdict(False, False, f"{record_path.name} is unreadable ({exc})")
    return verify(folder, required=bool(record.get(MANIFEST_KEY)))


def first_usable(
    items: Sequence[T], path_of: Callable[[T], str], kind: str = STATE_KIND
) -> tuple[T | None, list[tuple[str, str]]]:
    """The first of `items` (newest first) whose checkpoint may be loaded, or None; and the
    (path, why) of each one passed over."""
    # Bound before unpacking: unpacked from the call, mypy infers T as `T | None`
    # (python/mypy#20219).
    found = _first(items, path_of, kind)
    item, _, skipped = found
    return item, skipped


def pick_resume(path: str, step: int) -> Pick:
    """`path` (the state at `step`) if it may be loaded, else the newest earlier `step-N` state
    beside it that may; CheckpointUnusable when none may."""
    candidates = [(path, step), *earlier_states(path, step)]
    found = _first(candidates, lambda c: c[0], STATE_KIND)  # bound first, as in first_usable
    chosen, verdict, skipped = found
    if chosen is None or verdict is None:
        tried = "; ".join(f"{p}: {why}" for p, why in skipped)
        raise CheckpointUnusable(f"no checkpoint that can be loaded to resume from ({tried})")
    return Pick(chosen[0], chosen[1], verdict, skipped)


def _first(
    items: Sequence[T], path_of: Callable[[T], str], kind: str
) -> tuple[T | None, Verdict | None, list[tuple[str, str]]]:
    skipped: list[tuple[str, str]] = []
    for item in items:
        verdict = check(path_of(item), kind)
        if verdict.usable:
            return item, verdict, skipped
        skipped.append((path_of(item), verdict.reason))
    return None, None, skipped


def earlier_states(path: str, step: int) -> list[tuple[str, int]]:
    """The `<checkpoint_dir>/step-N/state` folders beside `path` with N < `step`, newest first."""
    if is_remote(path):
        return []
    folder = locate(path, STATE_KIND)
    checkpoint_dir = (folder.parent if folder.name == STATE_KIND else folder).parent
    if not checkpoint_dir.is_dir():
        return []
    found = []
    for entry in checkpoint_dir.iterdir():
        match = _STEP_NAME.match(entry.name)
        if match and int(match[1]) < step and entry.is_dir():
            found.append((str(entry / STATE_KIND), int(match[1])))
    return sorted(found, key=lambda c: c[1], reverse=True)
