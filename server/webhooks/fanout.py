"""From the event outbox to deliveries: events that happen by their absence (a stall, a sweep
whose last run ended) are noticed here; each new event becomes one delivery per matching
webhook, its body frozen then, and is marked fanned out in the same transaction."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core import events
from core.db import read_session, write_session
from core.models import (
    FINISHED,
    Metric,
    Run,
    RunEvent,
    RunStatus,
    Sweep,
    Webhook,
    WebhookDelivery,
    iso,
)
from server.runs.views import RunViews
from server.sweeps.schemas import SweepDetailOut
from server.webhooks.service import events_of

log = logging.getLogger(__name__)
BATCH = 500  # events fanned out per transaction
SweepView = Callable[[str], SweepDetailOut]


class FanOut:
    def __init__(
        self,
        engine: Engine,
        views: RunViews,
        clock: Callable[[], datetime],
        sweep_view: SweepView | None = None,
    ) -> None:
        self._engine = engine
        self._views = views
        self._clock = clock
        # How a sweep looks in its sweep.finished body (the sweeps service's view, when given).
        self._sweep_view = sweep_view

    # Events noticed by their absence -------------------------------------------------------

    def notice_stalls(self) -> int:
        """One run.stalled per run, attempt and step at which it stalled, by the API's rule."""
        with read_session(self._engine) as session:
            running = session.exec(select(Run).where(Run.status == RunStatus.running)).all()
        stalled = [
            run
            for run in running
            if self._views.stall(run, self._views.progress(run).time_per_step_s)[0]
        ]
        keys = {f"stall:{run.id}:{run.attempt}:{run.step}": run for run in stalled}
        if not keys:
            return 0
        # A stall lasts many ticks: only a new one takes the writers' lock.
        with read_session(self._engine) as session:
            known = set(session.exec(select(RunEvent.key).where(col(RunEvent.key).in_(keys))))
        added = 0
        for key, run in keys.items():
            if key in known:
                continue
            event = RunEvent(
                kind=events.RUN_STALLED,
                run_id=run.id,
                sweep_id=run.sweep_id,
                step=run.step,
                key=key,
            )
            with write_session(self._engine) as session:
                added += events.once(session, event)
        return added

    def notice_finished_sweeps(self) -> int:
        """Sweeps whose runs have all finished: finished_at set and sweep.finished, at once."""
        with read_session(self._engine) as session:
            ids = session.exec(select(Sweep.id).where(_finished_sweep())).all()
        for sweep_id in ids:
            with write_session(self._engine) as session:
                sweep = session.exec(
                    select(Sweep).where(Sweep.id == sweep_id, _finished_sweep())
                ).first()
                if sweep is None:  # a run of it was resumed meanwhile
                    continue
                sweep.finished_at = self._clock()
                session.add(sweep)
                key = f"sweep:{sweep.id}:finished"
                events.once(
                    session, RunEvent(kind=events.SWEEP_FINISHED, sweep_id=sweep.id, key=key)
                )
        return len(ids)

    # Fan-out -------------------------------------------------------------------------------

    def fan_out(self) -> int:
        """Turn new events into deliveries; how many events were handled."""
        with read_session(self._engine) as session:
            batch = session.exec(
                select(RunEvent)
                .where(col(RunEvent.fanned_out).is_(False))
                .order_by(col(RunEvent.id))
                .limit(BATCH)
            ).all()
            if not batch:
                return 0
            hooks = session.exec(select(Webhook)).all()
            planned = [
                (event.id, self._deliveries(session, event, hooks))
                for event in batch
                if event.id is not None
            ]
        with write_session(self._engine) as session:
            fresh = set(
                session.exec(
                    select(RunEvent.id).where(
                        col(RunEvent.id).in_([event_id for event_id, _ in planned]),
                        col(RunEvent.fanned_out).is_(False),
                    )
                ).all()
            )
            for event_id, deliveries in planned:
                if event_id not in fresh:
                    continue
                session.add_all(deliveries)
                event = session.get(RunEvent, event_id)
                assert event is not None
                event.fanned_out = True
                session.add(event)
        return len(fresh)

    def _deliveries(
        self, session: Session, event: RunEvent, hooks: Sequence[Webhook]
    ) -> list[WebhookDelivery]:
        wanted = [hook for hook in hooks if _matches(hook, event)]
        if not wanted:
            return []
        assert event.id is not None  # read back from the table
        content = self._content(session, event)
        order_key = event.run_id or event.sweep_id or "-"
        out = []
        for hook in wanted:
            delivery_id = f"d-{uuid.uuid4().hex}"
            body = {"id": delivery_id, "event": event.kind, "created_at": iso(event.created_at)}
            out.append(
                WebhookDelivery(
                    id=delivery_id,
                    webhook_id=hook.id,
                    event_id=event.id,
                    kind=event.kind,
                    order_key=order_key,
                    body=json.dumps({**body, **content}, separators=(",", ":")),
                    next_attempt_at=self._clock(),
                )
            )
        return out

    def _content(self, session: Session, event: RunEvent) -> dict[str, Any]:
        """What the body says beside id, event and time: the run (as it is now, with the
        metrics recorded at the event's step) or the sweep."""
        if event.run_id is None:
            assert event.sweep_id is not None
            sweep: dict[str, Any] | None = None
            if self._sweep_view is not None:
                try:
                    sweep = self._sweep_view(event.sweep_id).model_dump(mode="json")
                except Exception:  # the counts below still say how it ended
                    log.exception("sweep view of %s failed", event.sweep_id)
            return {"sweep": sweep or _sweep_summary(session, event.sweep_id)}
        run = session.get(Run, event.run_id)
        if run is None:
            return {"step": event.step, "run": {"run_id": event.run_id}}
        metrics = _metrics_at(session, run.id, event.step if event.step is not None else run.step)
        summary = self._views.summary(run, metrics.get("reward/mean"))
        return {
            "step": event.step,
            # The summary as the API answers it (it names its sweep_id), and the metrics.
            "run": {**summary.model_dump(mode="json"), "metrics": metrics},
        }


def _matches(hook: Webhook, event: RunEvent) -> bool:
    """The webhook asked for this kind (run.step: every step_every-th) and existed then."""
    if event.kind not in events_of(hook) or hook.created_at > event.created_at:
        return False
    if event.kind == events.RUN_STEP:
        return event.step is not None and event.step % hook.step_every == 0
    return True


def _finished_sweep() -> Any:
    """A sweep not yet marked finished that has runs, all of them finished."""
    member = col(Run.sweep_id) == col(Sweep.id)
    return (
        col(Sweep.finished_at).is_(None)
        & exists().where(member)
        & ~exists().where(member, col(Run.status).not_in(list(FINISHED)))
    )


def _metrics_at(session: Session, run_id: str, step: int) -> dict[str, Any]:
    """Every value recorded at `step` (training and evaluation rows together)."""
    rows = session.exec(
        select(Metric.values_json)
        .where(Metric.run_id == run_id, Metric.step == step)
        .order_by(col(Metric.id))
    ).all()
    values: dict[str, Any] = {}
    for values_json in rows:
        values.update(json.loads(values_json))
    return values


def _sweep_summary(session: Session, sweep_id: str) -> dict[str, Any]:
    sweep = session.get(Sweep, sweep_id)
    counts = dict(
        session.exec(
            select(Run.status, func.count()).where(Run.sweep_id == sweep_id).group_by(Run.status)
        ).all()
    )
    return {
        "sweep_id": sweep_id,
        "environment": sweep.environment if sweep else None,
        "metric": sweep.metric if sweep else None,
        "goal": sweep.goal if sweep else None,
        "finished_at": iso(sweep.finished_at) if sweep else None,
        "counts": {RunStatus(status).value: n for status, n in counts.items()},
    }
