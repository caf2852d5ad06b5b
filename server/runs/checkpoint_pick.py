"""Which of a run's checkpoints to load: its newest usable one, or the one at a step asked for;
a 409 or 404 saying what there is otherwise."""

from __future__ import annotations

from collections.abc import Sequence

from core.checkpoint_check import check, first_usable
from core.models import Checkpoint
from server.errors import Conflict, NotFound


def newest_loadable(run_id: str, rows: Sequence[Checkpoint], kind: str, verb: str) -> Checkpoint:
    """The newest of `rows` (newest first) that may be loaded: a half-written or corrupted one
    is passed over."""
    # Bound before unpacking: unpacked from the call, mypy infers the item type as
    # `Checkpoint | None` (python/mypy#20219).
    found = first_usable(rows, lambda r: r.path, kind)
    usable, skipped = found
    if usable is None:
        tried = "; ".join(f"{path}: {why}" for path, why in skipped)
        raise Conflict(
            f"Run {run_id} has no {kind} checkpoint that can be loaded to {verb} "
            f"({tried}); start a new run instead."
        )
    return usable


def at_step(
    run_id: str, rows: Sequence[Checkpoint], kind: str, step: int, verb: str, *, verify: bool
) -> Checkpoint:
    """The checkpoint of `rows` at `step`, checked loadable when `verify`."""
    for row in rows:
        if row.step == step:
            verdict = check(row.path, kind) if verify else None
            if verdict is not None and not verdict.usable:
                raise Conflict(
                    f"checkpoint_step: the checkpoint at step {step} cannot be loaded "
                    f"({verdict.reason}); {verb} another step or leave checkpoint_step out."
                )
            return row
    steps = ", ".join(str(s) for s in sorted({r.step for r in rows}))
    raise NotFound(
        f"checkpoint_step: run {run_id} has no checkpoint at step {step} ({kind}); "
        f"it has steps {steps}."
    )
