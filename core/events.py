"""The event outbox: what happened to a run or a sweep, added to the session that makes the
change (so the event commits with it, or not at all); webhooks are fanned out from it."""

from __future__ import annotations

from sqlmodel import Session, select

from core.models import Run, RunEvent, RunStatus

RUN_STARTED = "run.started"
RUN_STEP = "run.step"
RUN_STALLED = "run.stalled"
SWEEP_FINISHED = "sweep.finished"
STATUS_EVENTS = {
    RunStatus.running: RUN_STARTED,
    RunStatus.succeeded: "run.succeeded",
    RunStatus.failed: "run.failed",
    RunStatus.stopped: "run.stopped",
}
EVENT_KINDS = (
    RUN_STARTED,
    RUN_STEP,
    "run.succeeded",
    "run.failed",
    "run.stopped",
    RUN_STALLED,
    SWEEP_FINISHED,
)


def status_changed(session: Session, run: Run, new: RunStatus) -> None:
    """`run` has just moved to `new`: an event when that status is one webhooks hear of."""
    kind = STATUS_EVENTS.get(new)
    if kind is not None:
        session.add(RunEvent(kind=kind, run_id=run.id, sweep_id=run.sweep_id, step=run.step))


def stepped(session: Session, run: Run, step: int) -> None:
    session.add(RunEvent(kind=RUN_STEP, run_id=run.id, sweep_id=run.sweep_id, step=step))


def once(session: Session, event: RunEvent) -> bool:
    """Add `event` unless one with its key exists (a stall, a sweep's end happen once).

    Callers hold a write session, whose transaction takes the writers' lock up front, so no
    other writer can add the same key between this check and the commit."""
    assert event.key is not None
    if session.exec(select(RunEvent.id).where(RunEvent.key == event.key)).first() is not None:
        return False
    session.add(event)
    return True
