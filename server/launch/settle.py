"""How an attempt that ended without recording its own end is written down: one rule for every
launcher. A run whose runner recorded an end keeps it (only its exit code is added); a run
that was stopping is `stopped`; any other is `failed`, with a kind and the reason in words."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from core import lifecycle
from core.db import write_session
from core.models import FINISHED, Run, RunStatus
from core.run_folder import RunFolder

LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class Ending:
    """An attempt's end as its launcher saw it."""

    exit_code: int | None
    # What a run that was stopping records ("stopped on request; ...").
    stop_details: str
    # What any other run records: failed with this kind for this reason, or stopped for it
    # when the kind is None (stopped from outside this server, e.g. `ray job stop`).
    failure_kind: str | None
    summary: str
    # The log's last lines and where they were read; None: the run folder's train.log.
    log_tail: list[str] | None = None
    log_name: str = "train.log"


def settle(
    engine: Engine, run_id: str, ending: Ending, same_attempt: Callable[[Run], bool]
) -> None:
    """Record `ending` for the run, unless `same_attempt` says the row has moved on to a later
    attempt (a resume), whose end this is not."""
    with write_session(engine) as session:
        run = session.get(Run, run_id)
        if run is None or not same_attempt(run):
            return
        status = RunStatus(run.status)
        if status in FINISHED:
            if ending.exit_code is not None and run.exit_code is None:
                lifecycle.transition(session, run, status, exit_code=ending.exit_code)
            return
        if status == RunStatus.stopping or ending.failure_kind is None:
            details = ending.stop_details if status == RunStatus.stopping else ending.summary
            lifecycle.transition(
                session, run, RunStatus.stopped, exit_code=ending.exit_code, details=details
            )
        else:
            lines = ending.log_tail
            if lines is None:
                lines = RunFolder(run.run_dir).log_tail(LOG_TAIL_LINES)
            lifecycle.transition(
                session,
                run,
                RunStatus.failed,
                exit_code=ending.exit_code,
                failure_kind=ending.failure_kind,
                details=with_log_tail(ending.summary, lines, ending.log_name)[-8000:],
            )


def with_log_tail(summary: str, lines: list[str], where: str) -> str:
    """The reason, then the last lines of the log (`where` names it)."""
    if not lines:
        return f"{summary}. The log is empty."
    return f"{summary}. Last lines of {where}:\n" + "\n".join(lines)[-4000:]
