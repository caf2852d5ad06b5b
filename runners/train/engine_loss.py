"""A run whose engine host went (killed, out of memory) resumes by itself: its newest complete
state checkpoint becomes its resume point, the steps after it are rewound (metrics and rollouts:
no gap and no step twice), its record says what happened, and the runner starts again in the
same process (exec: the same pid and start time, so whoever watches it still does), on a new
host that the first client to need one starts.

A run that keeps losing its host without getting past a step gives up after MAX_RESUMES.
"""

from __future__ import annotations

import logging
import os
import sys

from sqlalchemy.engine import Engine

from core import lifecycle
from core.checkpoint_check import CheckpointUnusable, pick_resume
from core.engine_client import EngineLost
from core.run_folder import RunFolder
from core.spec import ResumePoint

log = logging.getLogger("runner")
MAX_RESUMES = 3  # in a row at the same step
RESUMES_VARIABLE = "RLCS_ENGINE_RESUMES"  # "<step>:<count>", carried through exec


def lost_engine(exc: BaseException) -> EngineLost | None:
    """The EngineLost behind `exc`, however the loop wrapped it (a cause or a context)."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, EngineLost):
            return current
        stack += [current.__cause__, current.__context__]
        if isinstance(current, BaseExceptionGroup):
            stack += list(current.exceptions)
    return None


def resume_on_a_new_host(engine: Engine, folder: RunFolder, run_id: str, lost: EngineLost) -> str:
    """Rewind to the newest complete checkpoint and exec the runner again (never returns);
    the reason it cannot, when it cannot (the run then fails with it)."""
    step_now = _recorded_step(engine, run_id)
    last_step, count = _resumes()
    count = count + 1 if last_step == step_now else 1
    if count > MAX_RESUMES:
        return (
            f"the engine host was lost {MAX_RESUMES} times at step {step_now} without the run "
            f"getting further; last: {_first_line(str(lost))}"
        )
    point = _newest_checkpoint(folder)
    step = point.step if point is not None else 0
    if point is not None:
        folder.write_resume(point)
    else:
        folder.clear_resume()  # nothing saved yet: from the start
    lifecycle.rewind(engine, run_id, step)
    what = f"from its checkpoint of step {step}" if point else "from the start (no checkpoint yet)"
    note = (
        f"the engine host was lost at step {step_now} ({_first_line(str(lost))}); the run "
        f"resumed by itself {what} on a new host"
    )
    lifecycle.record_fields(engine, run_id, details=note)
    log.warning("%s", note)
    logging.shutdown()
    os.environ[RESUMES_VARIABLE] = f"{step_now}:{count}"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


def _newest_checkpoint(folder: RunFolder) -> ResumePoint | None:
    states = [r for r in folder.checkpoint_records() if r.get("state_path")]
    if not states:
        return None
    newest = max(states, key=lambda r: int(r["step"]))
    try:
        pick = pick_resume(str(newest["state_path"]), int(newest["step"]))
    except CheckpointUnusable as exc:
        log.warning("no checkpoint to resume from: %s", exc)
        return None
    return ResumePoint(state_path=pick.path, step=pick.step)


def _recorded_step(engine: Engine, run_id: str) -> int:
    from core.db import read_session
    from core.models import Run

    with read_session(engine) as session:
        run = session.get(Run, run_id)
    return run.step if run is not None else 0


def _resumes() -> tuple[int | None, int]:
    raw = os.environ.get(RESUMES_VARIABLE, "")
    try:
        step, count = raw.split(":")
        return int(step), int(count)
    except ValueError:
        return None, 0


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else text
