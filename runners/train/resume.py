"""Where a resumed run starts: the checkpoint it was asked to resume from if its files check
out, else the newest earlier complete one beside it; a checkpoint passed over is logged, never
loaded."""

from __future__ import annotations

import logging

from core.checkpoint_check import pick_resume

log = logging.getLogger("runner")


def loadable_state(path: str, step: int) -> tuple[str, int]:
    """The state checkpoint to resume from and its step (CheckpointUnusable when none is left)."""
    pick = pick_resume(path, step)
    for skipped, why in pick.skipped:
        log.warning("skipping checkpoint %s: %s", skipped, why)
    if pick.skipped:
        log.warning("falling back to checkpoint %s (step %s)", pick.path, pick.step)
    return pick.path, pick.step
