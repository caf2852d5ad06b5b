"""The run state machine, shared by the server and the runner (DESIGN §4).

Every status change goes through `transition`, which refuses to leave a finished state;
the runner records `running`, each step, checkpoints and its own end through this module.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, func, or_
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core import cost, events, rollout_store
from core.db import read_session, write_session
from core.models import (
    ACTIVE,
    FINISHED,
    TINKER_API,
    Checkpoint,
    Metric,
    Run,
    RunStatus,
    utcnow,
)
from core.run_folder import clean_metrics

# Which status may follow which; a finished status is final (a resume starts a new attempt).
ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    # A Ray job waits `queued` until the cluster runs it, and its runner then records
    # `running` itself; stopping such a job takes a moment (`stopping`).
    RunStatus.queued: frozenset(
        {
            RunStatus.starting,
            RunStatus.running,
            RunStatus.stopping,
            RunStatus.stopped,
            RunStatus.failed,
        }
    ),
    RunStatus.starting: frozenset(
        {
            RunStatus.running,
            RunStatus.stopping,
            RunStatus.failed,
            RunStatus.succeeded,
            RunStatus.stopped,
        }
    ),
    RunStatus.running: frozenset(
        {RunStatus.stopping, RunStatus.succeeded, RunStatus.failed, RunStatus.stopped}
    ),
    RunStatus.stopping: frozenset({RunStatus.stopped, RunStatus.failed, RunStatus.succeeded}),
}


def transition(session: Session, run: Run, new: RunStatus, **fields: Any) -> bool:
    """Move `run` to `new` (setting `fields`) if allowed; False and no change otherwise."""
    current = RunStatus(run.status)
    if new == current:
        _apply(run, fields)
        session.add(run)
        return True
    if new not in ALLOWED.get(current, frozenset()):
        return False
    now = utcnow()
    run.status = new
    if new == RunStatus.running and run.started_at is None:
        run.started_at = now
    if new == RunStatus.stopping and run.stop_requested_at is None:
        run.stop_requested_at = now
    if new in FINISHED:
        run.finished_at = now
    _apply(run, fields)
    session.add(run)
    events.status_changed(session, run, new)
    return True


def reopen(session: Session, run: Run) -> bool:
    """Queue a finished run again as a new attempt (resume): the one way out of a finished state."""
    if RunStatus(run.status) not in FINISHED:
        return False
    run.status = RunStatus.queued
    run.attempt += 1
    for name in (
        "pid",
        "process_start",
        "exit_code",
        "failure_kind",
        "details",
        "finished_at",
        "stop_requested_at",
        "launcher",
        "job_id",
    ):
        setattr(run, name, None)
    session.add(run)
    return True


def stop_requested(engine: Engine, run_id: str) -> bool:
    """Has someone asked this run to stop (POST /runs/{id}/stop on any server)?"""
    with read_session(engine) as session:
        run = session.get(Run, run_id)
    return run is not None and run.status == RunStatus.stopping


def set_status(engine: Engine, run_id: str, new: RunStatus, **fields: Any) -> bool:
    with write_session(engine) as session:
        run = session.get(Run, run_id)
        return run is not None and transition(session, run, new, **fields)


def _apply(run: Run, fields: dict[str, Any]) -> None:
    for key, value in fields.items():
        if not hasattr(run, key):
            raise AttributeError(f"Run has no field {key}")
        setattr(run, key, value)


# The runner's records ------------------------------------------------------------------


def record_running(engine: Engine, run_id: str, pid: int, process_start: float | None) -> bool:
    """The runner is up: record its pid (so a restarted server can adopt it) and `running`."""
    return set_status(engine, run_id, RunStatus.running, pid=pid, process_start=process_start)


def record_step(
    engine: Engine,
    run_id: str,
    step: int,
    metrics: dict[str, float],
    *,
    at: datetime | None = None,
    spent: cost.Spent | None = None,
) -> dict[str, float]:
    """One finished training step: its metrics row, the run's progress and what it `spent`
    (a Tinker API session's, read from its metrics) added to the run's totals, in one
    transaction. The metrics recorded: these with the run's cost totals (cost/*)."""
    with write_session(engine) as session:
        run = session.get(Run, run_id)
        if run is None:
            return metrics
        if spent is None and run.source == TINKER_API:
            spent = cost.session_spent(metrics)
        if spent is not None:
            metrics = {**metrics, **cost.charge(run, spent)}
        session.add(
            Metric(run_id=run_id, step=step, values_json=json.dumps(clean_metrics(metrics)))
        )
        run.step = max(run.step, step)
        run.last_step_at = at or utcnow()
        session.add(run)
        events.stepped(session, run, step)
    return metrics


def record_spent(engine: Engine, run_id: str, spent: cost.Spent) -> None:
    """What a run spent after its last step (a last checkpoint, an evaluation, closing)."""
    with write_session(engine) as session:
        run = session.get(Run, run_id)
        if run is not None:
            cost.charge(run, spent)
            session.add(run)


def record_metrics(engine: Engine, run_id: str, step: int, metrics: dict[str, float]) -> None:
    """Metrics that are not a training step (e.g. an evaluation) at `step`."""
    with write_session(engine) as session:
        session.add(
            Metric(run_id=run_id, step=step, values_json=json.dumps(clean_metrics(metrics)))
        )


def record_checkpoint(
    engine: Engine,
    run_id: str,
    step: int,
    kind: str,
    name: str,
    path: str,
    expires_at: datetime | None = None,
) -> None:
    """A checkpoint folder written at `step` (deleted once `expires_at` passes, if given); one
    written again at the same path (a name saved again with overwrite) replaces its row."""
    with write_session(engine) as session:
        session.exec(
            delete(Checkpoint).where(col(Checkpoint.run_id) == run_id, col(Checkpoint.path) == path)
        )
        session.add(
            Checkpoint(
                run_id=run_id, step=step, kind=kind, name=name, path=path, expires_at=expires_at
            )
        )
        if kind == "sampler":
            run = session.get(Run, run_id)
            if run is not None:
                run.weights_path = path
                session.add(run)


def rewind(engine: Engine, run_id: str, step: int) -> None:
    """A resume starts from an earlier step than the one recorded (its checkpoint could not be
    loaded): metrics and rollouts past `step` belong to steps that will be done again."""
    with write_session(engine) as session:
        run = session.get(Run, run_id)
        if run is None:
            return
        session.exec(delete(Metric).where(col(Metric.run_id) == run_id, col(Metric.step) > step))
        rollout_store.delete_after(session, run_id, step)
        run.step = step
        session.add(run)


def record_fields(engine: Engine, run_id: str, **fields: Any) -> None:
    """Non-status facts about a run (W&B path and URL, weights path)."""
    with write_session(engine) as session:
        run = session.get(Run, run_id)
        if run is not None:
            _apply(run, fields)
            session.add(run)


def record_end(
    engine: Engine,
    run_id: str,
    status: RunStatus,
    *,
    failure_kind: str | None = None,
    details: str | None = None,
) -> bool:
    """The runner's own end: succeeded, stopped (after SIGTERM) or failed (a caught error).
    A success keeps the details the run recorded on its way (a resume of its own, say)."""
    if status not in FINISHED:
        raise ValueError(f"{status} is not a final status")
    fields: dict[str, Any] = {"failure_kind": failure_kind}
    if details is not None or status != RunStatus.succeeded:
        fields["details"] = details
    return set_status(engine, run_id, status, **fields)


def count_active(session: Session) -> int:
    """Runs holding a slot (starting, running or stopping, or a Ray job waiting for the
    cluster): what the concurrency limit counts. A Tinker API session holds none: it runs no
    runner (its models live in the server's engine, admitted by the memory budget)."""
    not_a_session = or_(col(Run.launcher).is_(None), col(Run.launcher) != TINKER_API)
    query = select(func.count()).select_from(Run).where(holds_a_slot(), not_a_session)
    return session.exec(query).one()


def holds_a_slot() -> ColumnElement[bool]:
    """Unfinished runs a launcher watches."""
    return or_(
        col(Run.status).in_(list(ACTIVE)),
        and_(col(Run.status) == RunStatus.queued, col(Run.job_id).is_not(None)),
    )
