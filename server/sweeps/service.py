"""Sweeps: many runs from one base config and a grid (or a list) of overrides, every
combination validated before any run exists; their results side by side and the best run."""

from __future__ import annotations

import builtins
import itertools
import json
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from core.db import read_session
from core.models import FINISHED, SWEEP_ID, Run, RunStatus, Sweep, iso
from server.environments.configs import ConfigService
from server.errors import DomainError, InvalidValue, NotFound
from server.runs.metrics import SUMMARY_KEYS, MetricsService, summarize
from server.runs.service import PlannedRun, RunService
from server.sweeps.schemas import (
    MAX_SWEEP_RUNS,
    SweepBestOut,
    SweepCreatedOut,
    SweepDetailOut,
    SweepOut,
    SweepRunOut,
    SweepStoppedOut,
)

HARD_MAX_RUNS = MAX_SWEEP_RUNS  # beyond this a sweep is a different tool


class SweepService:
    def __init__(self, runs: RunService, configs: ConfigService, metrics: MetricsService) -> None:
        self._runs = runs
        self._configs = configs
        self._metrics = metrics

    # Creating ----------------------------------------------------------------------------

    def create(
        self,
        environment: str | None,
        base: dict[str, Any],
        grid: dict[str, list[Any]] | None,
        combos: list[dict[str, Any]] | None,
        metric: str,
        goal: str,
        max_runs: int,
        idempotency_key: str | None = None,
    ) -> SweepCreatedOut:
        """Validate every combination, then write the sweep and all its runs at once."""
        if idempotency_key is not None:
            existing = self._by_idempotency_key(idempotency_key)
            if existing is not None:
                return self._created(existing.id)
        sets = expand(grid, combos, max_runs)
        name = environment or self._configs.selected()
        sweep_id = self._new_id()
        planned = self._plan(name, base, sets, sweep_id)

        def sweep_row() -> list[Sweep]:
            # Each member's own overrides by run id (the ids exist once launch named them).
            combos = {p.run.id: own for p, own in zip(planned, sets, strict=True)}
            return [
                Sweep(
                    id=sweep_id,
                    environment=planned[0].run.environment,
                    base_json=json.dumps(base, sort_keys=True),
                    combos_json=json.dumps(combos),
                    metric=metric,
                    goal=goal,
                    idempotency_key=idempotency_key,
                )
            ]

        return self._launch(sweep_id, planned, sweep_row, idempotency_key)

    def _plan(
        self, name: str, base: dict[str, Any], sets: list[dict[str, Any]], sweep_id: str
    ) -> list[PlannedRun]:
        """A planned run for each set of overrides, each validated; the first bad one refuses
        the whole sweep, naming its combination."""
        planned: list[PlannedRun] = []
        for index, own in enumerate(sets):
            clash = sorted(set(own) & {"environment"})
            if clash:
                raise InvalidValue(
                    "grid: 'environment' cannot vary within a sweep; give it once at the top."
                )
            try:
                entry, config = self._configs.resolve(name, {**base, **own})
                self._configs.check_model(config)
            except DomainError as exc:
                where = f"combination {index + 1} of {len(sets)} ({_short(own)})" if own else "base"
                raise type(exc)(f"{where}: {exc.detail} Nothing was created.", **exc.extra) from exc
            planned.append(self._runs.plan(entry, config, sweep_id=sweep_id))
        return planned

    def _launch(
        self,
        sweep_id: str,
        planned: list[PlannedRun],
        sweep_row: Callable[[], list[Sweep]],
        idempotency_key: str | None,
    ) -> SweepCreatedOut:
        """Write the sweep and its runs at once; when a twin request won the race to write
        them, its sweep."""
        try:
            self._runs.launch(planned, sweep_row)
        except IntegrityError:
            # The same Idempotency-Key, sent twice at once: the first one made the sweep.
            existing = self._by_idempotency_key(idempotency_key) if idempotency_key else None
            if existing is None:
                raise
            return self._created(existing.id)
        return self._created(sweep_id)

    def _created(self, sweep_id: str) -> SweepCreatedOut:
        with read_session(self._runs.engine) as session:
            ids = session.exec(
                select(Run.id).where(Run.sweep_id == sweep_id).order_by(col(Run.created_at))
            ).all()
        return SweepCreatedOut(sweep_id=sweep_id, run_ids=list(ids))

    def _by_idempotency_key(self, key: str) -> Sweep | None:
        with read_session(self._runs.engine) as session:
            return session.exec(select(Sweep).where(Sweep.idempotency_key == key)).first()

    def _new_id(self) -> str:
        return f"s-{secrets.token_hex(4)}"

    # Reading -----------------------------------------------------------------------------

    def list(self, limit: int = 100, offset: int = 0) -> list[SweepOut]:
        with read_session(self._runs.engine) as session:
            sweeps = session.exec(
                select(Sweep)
                .order_by(col(Sweep.created_at).desc(), col(Sweep.id).desc())
                .offset(offset)
                .limit(limit)
            ).all()
            members = session.exec(
                select(Run.sweep_id, Run.status, Run.finished_at).where(
                    col(Run.sweep_id).in_([s.id for s in sweeps])
                )
            ).all()
        counts: dict[str, dict[str, int]] = {}
        last: dict[str, datetime] = {}
        for sweep_id, status, finished_at in members:
            bucket = counts.setdefault(sweep_id or "", {})
            name = RunStatus(status).value
            bucket[name] = bucket.get(name, 0) + 1
            if finished_at is not None and sweep_id is not None:
                last[sweep_id] = max(finished_at, last.get(sweep_id, finished_at))
        return [self._head(sweep, counts.get(sweep.id, {}), last.get(sweep.id)) for sweep in sweeps]

    def get(self, sweep_id: str) -> SweepDetailOut:
        """Each run's status, overrides and final (or latest) metrics, and the best run by
        the sweep's metric among the runs that have it."""
        sweep = self.row(sweep_id)
        runs = self.members(sweep_id)
        combos = json.loads(sweep.combos_json)
        counts: dict[str, int] = {}
        rows = []
        for run in runs:
            counts[run.status.value] = counts.get(run.status.value, 0) + 1
            latest = self._metrics.latest_values(run.id)
            rows.append(
                SweepRunOut(
                    run_id=run.id,
                    overrides=combos.get(run.id, {}),
                    status=run.status.value,
                    step=run.step,
                    total_steps=run.total_steps,
                    failure_kind=run.failure_kind,
                    metrics=summarize(latest, run.step),
                    value=_number(latest.get(metric_key(sweep.metric))),
                )
            )
        return SweepDetailOut(
            **self._head(sweep, counts, _last_finished(runs)).model_dump(),
            runs=rows,
            best=best_of(rows, sweep.goal, finished=not _unfinished(runs)),
        )

    def members(self, sweep_id: str) -> builtins.list[Run]:
        with read_session(self._runs.engine) as session:
            return list(
                session.exec(
                    select(Run)
                    .where(Run.sweep_id == sweep_id)
                    .order_by(col(Run.created_at), col(Run.id))
                ).all()
            )

    def row(self, sweep_id: str) -> Sweep:
        if not SWEEP_ID.match(sweep_id):
            raise InvalidValue(
                f"sweep_id: '{sweep_id[:40]}' is not a sweep id; sweep ids look like s-3f9c2a1b "
                "(GET /sweeps lists them)."
            )
        with read_session(self._runs.engine) as session:
            sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            raise NotFound(f"No sweep '{sweep_id}'. GET /sweeps lists the sweeps.")
        return sweep

    def _head(
        self, sweep: Sweep, counts: dict[str, int], last_finished: datetime | None
    ) -> SweepOut:
        """`last_finished`: when its last run finished; a sweep has finished when all have (the
        webhook fan-out announces it a moment later, which the answer does not wait for)."""
        total = sum(counts.values())
        done = sum(n for status, n in counts.items() if RunStatus(status) in FINISHED)
        finished = bool(total) and done == total
        return SweepOut(
            sweep_id=sweep.id,
            environment=sweep.environment,
            base=json.loads(sweep.base_json),
            metric=sweep.metric,
            goal=sweep.goal,
            status="finished" if finished else "running",
            runs_total=total,
            runs_finished=done,
            counts=counts,
            created_at=iso(sweep.created_at),
            finished_at=iso(last_finished) if finished else None,
        )

    # Stopping ----------------------------------------------------------------------------

    def stop(self, sweep_id: str) -> SweepStoppedOut:
        """Stop every run of the sweep that has not finished (queued ones are cancelled)."""
        self.row(sweep_id)
        stopped = [
            self._runs.stop(run.id)
            for run in self.members(sweep_id)
            if RunStatus(run.status) not in FINISHED
        ]
        return SweepStoppedOut(sweep_id=sweep_id, runs=stopped)


def expand(
    grid: dict[str, list[Any]] | None, combos: list[dict[str, Any]] | None, max_runs: int
) -> list[dict[str, Any]]:
    """The override sets of a sweep: the grid's cartesian product (in the order its fields
    were given) or the explicit list; refused past `max_runs` before anything is built."""
    if (grid is None) == (combos is None):
        raise InvalidValue("body: give either grid (field -> list of values) or runs, not both.")
    if combos is not None:
        if not combos:
            raise InvalidValue("runs: an empty list; give at least one set of overrides.")
        count = len(combos)
    else:
        assert grid is not None
        if not grid:
            raise InvalidValue("grid: no fields; give at least one field with a list of values.")
        for field, values in grid.items():
            if not values:
                raise InvalidValue(f"grid.{field}: an empty list; give at least one value.")
        count = 1
        for values in grid.values():
            count *= len(values)
    if count > max_runs:
        raise InvalidValue(
            f"max_runs: the sweep has {count} combinations, more than max_runs ({max_runs}); "
            f"shrink the grid, or raise max_runs (at most {HARD_MAX_RUNS}) if you mean it."
        )
    if combos is not None:
        return [dict(c) for c in combos]
    assert grid is not None
    fields = list(grid)
    return [dict(zip(fields, values, strict=True)) for values in itertools.product(*grid.values())]


def metric_key(metric: str) -> str:
    """A summary name (reward_mean, loss, ...) or a recorded key (reward/mean) as recorded."""
    return SUMMARY_KEYS.get(metric, metric)


def best_of(rows: list[SweepRunOut], goal: str, finished: bool) -> SweepBestOut | None:
    """The run with the highest (goal max) or lowest (min) value among those that have one;
    succeeded runs are preferred to runs that failed or stopped on the way."""
    scored = [(r, r.value) for r in rows if r.value is not None]
    good = [(r, v) for r, v in scored if r.status == RunStatus.succeeded.value] or scored
    if not good:
        return None
    pick = max if goal == "max" else min
    best, value = pick(good, key=lambda pair: pair[1])
    return SweepBestOut(
        run_id=best.run_id,
        value=value,
        overrides=best.overrides,
        status=best.status,
        final=finished,
    )


def _unfinished(runs: list[Run]) -> bool:
    return any(RunStatus(r.status) not in FINISHED for r in runs)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _short(values: dict[str, Any]) -> str:
    text = json.dumps(values, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def _last_finished(runs: builtins.list[Run]) -> datetime | None:
    ends = [run.finished_at for run in runs if run.finished_at is not None]
    return max(ends) if ends else None
