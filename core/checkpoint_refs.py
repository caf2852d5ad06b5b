"""A run's sampler checkpoint named in a config (`kl_reference`, `teacher`): `r-3f9c2a1b` (its
newest) or `r-3f9c2a1b@step-10`, as /v1 names them. The server checks and pins a reference
when it freezes a run; the runner reads the checkpoint's path from the database at its start.
"""

from __future__ import annotations

import re

RUN_REFERENCE = re.compile(r"^(r-[0-9a-f]{8})(?:@step-(\d{1,9}))?$")
BASE = "base"  # kl_reference: the run's own base model, its adapter switched off
FORMS = "r-3f9c2a1b (a run's newest checkpoint) or r-3f9c2a1b@step-10"


def parse(value: str) -> tuple[str, int | None] | None:
    """(run id, step or None for the newest) of a run reference; None for anything else."""
    match = RUN_REFERENCE.match(value)
    if match is None:
        return None
    return match.group(1), int(match.group(2)) if match.group(2) is not None else None


def pinned(run_id: str, step: int) -> str:
    """The reference to one step's checkpoint, as a frozen config keeps it."""
    return f"{run_id}@step-{step}"
