"""Rollouts in the database (DESIGN §14): a step's kept records and its summary written in one
transaction, the run's size cap kept by thinning older steps first, and the reads the API pages
through. The database, not the run's folder: a Ray run's runner shares only the database."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, func, insert, or_
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core.db import write_session
from core.models import Rollout, RolloutStep
from core.rollouts import Picked, Rewards, RolloutRecord, body_json, finite, prompt_key
from core.run_folder import clean_metrics


@dataclass(frozen=True)
class Written:
    """What writing a step did: rows kept, and the steps the size cap thinned."""

    kept: int
    thinned_steps: list[int]


def write_step(
    engine: Engine,
    run_id: str,
    step: int,
    picked: Sequence[tuple[RolloutRecord, Picked]],
    *,
    sampled: list[RolloutRecord],
    max_bytes: int,
    metrics: dict[str, float] | None = None,
) -> Written:
    """The step's kept records and summary (replacing a step done again after a resume), then
    the run's size cap: older steps thinned first, the newest trimmed only if alone too big."""
    rows = [_rollout_row(run_id, step, record, how) for record, how in picked]
    rewards = Rewards.of(sampled)
    kind = sampled[0].kind if sampled else "episode"
    with write_session(engine) as session:
        _delete_steps(session, run_id, col(Rollout.step) == step, col(RolloutStep.step) == step)
        if rows:
            session.execute(insert(Rollout), rows)
        session.add(
            RolloutStep(
                run_id=run_id,
                step=step,
                kind=kind,
                sampled=len(sampled),
                recorded=len(rows),
                kept=len(rows),
                size=sum(int(r["size"]) for r in rows),
                reward_mean=rewards.mean,
                reward_min=rewards.low,
                reward_max=rewards.high,
                metrics_json=json.dumps(clean_metrics(metrics or {})),
            )
        )
        session.flush()
        thinned = keep_under(session, run_id, max_bytes, newest=step)
    return Written(kept=len(rows), thinned_steps=thinned)


def _rollout_row(run_id: str, step: int, record: RolloutRecord, how: Picked) -> dict[str, Any]:
    """A kept record as its Rollout row (its body as JSON, and that body's size)."""
    return {
        "run_id": run_id,
        "step": step,
        "kind": record.kind,
        "group_index": record.group,
        "position": record.index,
        "reward": finite(record.reward),
        "advantage": finite(record.advantage),
        "picked": how,
        "prompt_key": prompt_key(record.prompt),
        "body_json": (body := body_json(record)),
        "size": len(body.encode()),
    }


def note_step(engine: Engine, run_id: str, step: int, note: str) -> None:
    """A word on a step's record (why it holds nothing: the record stopped)."""
    with write_session(engine) as session:
        row = session.get(RolloutStep, (run_id, step))
        if row is None:
            row = RolloutStep(
                run_id=run_id, step=step, kind="episode", sampled=0, recorded=0, kept=0, size=0
            )
        row.note = note
        session.add(row)


def keep_under(session: Session, run_id: str, max_bytes: int, newest: int) -> list[int]:
    """Thin the run's record until it fits `max_bytes`: each older step, oldest first, down to
    its best and worst episode; then older steps' episodes dropped, oldest first (their
    summaries stay); last, the newest step's own, keeping its best and worst first. The steps
    changed."""
    total = _total(session, run_id)
    if total <= max_bytes:
        return []
    steps = session.exec(
        select(RolloutStep)
        .where(col(RolloutStep.run_id) == run_id, col(RolloutStep.kept) > 0)
        .order_by(col(RolloutStep.step))
    ).all()
    older = [s for s in steps if s.step != newest]
    newest_rows = [s for s in steps if s.step == newest]
    changed: set[int] = set()
    for keep in (_ends, _nothing):
        for summary in older:
            if total <= max_bytes:
                return sorted(changed)
            if keep is _ends and summary.kept <= 2:
                continue  # already at its ends (or never held more)
            freed = _thin(session, summary, keep, "thinned to its best and worst episode")
            if freed:
                total -= freed
                changed.add(summary.step)
    for summary in newest_rows:
        if total > max_bytes:
            total -= _thin(session, summary, _fitting(total - max_bytes), "cut to fit the cap")
            changed.add(summary.step)
    return sorted(changed)


@dataclass(frozen=True)
class _Row:
    id: int
    reward: float | None
    size: int


# Which of a step's rows to keep, by id.
Keep = Callable[[list[_Row]], set[int]]


def _ends(rows: list[_Row]) -> set[int]:
    rewarded = [r for r in rows if r.reward is not None]
    if not rewarded:
        return {rows[0].id} if rows else set()
    return {min(rewarded, key=_by_reward).id, max(rewarded, key=_by_reward).id}


def _by_reward(row: _Row) -> float:
    return row.reward if row.reward is not None else 0.0


def _nothing(_rows: list[_Row]) -> set[int]:
    return set()


def _fitting(excess: int) -> Keep:
    """Keep the best and worst, then the others in order, dropping from the end until
    `excess` bytes are freed."""

    def keep(rows: list[_Row]) -> set[int]:
        ends = _ends(rows)
        order = [r for r in rows if r.id in ends] + [r for r in rows if r.id not in ends]
        freed = 0
        while order and freed < excess:
            freed += order.pop().size
        return {r.id for r in order}

    return keep


def _thin(session: Session, summary: RolloutStep, keep: Keep, why: str) -> int:
    """Delete the step's rows that `keep` does not keep; the bytes freed."""
    found = session.exec(
        select(Rollout.id, Rollout.reward, Rollout.size)
        .where(col(Rollout.run_id) == summary.run_id, col(Rollout.step) == summary.step)
        .order_by(col(Rollout.id))
    ).all()
    rows = [_Row(int(i or 0), r, int(s)) for i, r, s in found]
    kept = keep(rows)
    gone = [r for r in rows if r.id not in kept]
    if not gone:
        return 0
    session.exec(delete(Rollout).where(col(Rollout.id).in_([r.id for r in gone])))
    freed = sum(r.size for r in gone)
    summary.kept = len(rows) - len(gone)
    summary.size -= freed
    summary.note = (
        f"{why} (the run's rollouts_max_mb)"
        if summary.kept
        else "its episodes dropped to keep the run under its rollouts_max_mb"
    )
    session.add(summary)
    return freed


def _total(session: Session, run_id: str) -> int:
    query = select(func.coalesce(func.sum(RolloutStep.size), 0)).where(
        col(RolloutStep.run_id) == run_id
    )
    return int(session.exec(query).one())


def delete_after(session: Session, run_id: str, step: int) -> None:
    """A resume goes back to `step`: the record of the steps after it goes (they are redone)."""
    _delete_steps(session, run_id, col(Rollout.step) > step, col(RolloutStep.step) > step)


def _delete_steps(
    session: Session,
    run_id: str,
    rows_where: ColumnElement[bool],
    steps_where: ColumnElement[bool],
) -> None:
    session.exec(delete(Rollout).where(col(Rollout.run_id) == run_id, rows_where))
    session.exec(delete(RolloutStep).where(col(RolloutStep.run_id) == run_id, steps_where))


# Reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    step: int | None = None
    group: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    prompt_key: str | None = None


def page(
    session: Session,
    run_id: str,
    filters: Filters,
    limit: int,
    after: tuple[int, int] | None = None,
) -> list[Rollout]:
    """Up to `limit` rows in (step, id) order, from after the (step, id) `after`."""
    query = select(Rollout).where(col(Rollout.run_id) == run_id)
    if filters.step is not None:
        query = query.where(col(Rollout.step) == filters.step)
    if filters.group is not None:
        query = query.where(col(Rollout.group_index) == filters.group)
    if filters.min_reward is not None:
        query = query.where(col(Rollout.reward) >= filters.min_reward)
    if filters.max_reward is not None:
        query = query.where(col(Rollout.reward) <= filters.max_reward)
    if filters.prompt_key is not None:
        query = query.where(col(Rollout.prompt_key) == filters.prompt_key)
    if after is not None:
        step, row_id = after
        query = query.where(
            or_(col(Rollout.step) > step, and_(col(Rollout.step) == step, col(Rollout.id) > row_id))
        )
    query = query.order_by(col(Rollout.step), col(Rollout.id)).limit(limit)
    return list(session.exec(query).all())


def steps(session: Session, run_id: str) -> list[RolloutStep]:
    return list(
        session.exec(
            select(RolloutStep)
            .where(col(RolloutStep.run_id) == run_id)
            .order_by(col(RolloutStep.step))
        ).all()
    )
