"""A run's recorded rollouts as the API reads them (DESIGN §14): pages of episodes filtered by
step, group, reward or prompt, each step's record, and every episode for an export."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from sqlalchemy.engine import Engine

from core import rollout_store, rollouts
from core.db import read_session
from core.models import Rollout, RolloutStep
from core.rollout_store import Filters
from server.errors import InvalidValue
from server.runs.rollout_schemas import (
    RolloutOut,
    RolloutPageOut,
    RolloutStepOut,
    RolloutStepsOut,
    SegmentOut,
)
from server.runs.service import RunService

# A page's cursor: the step and row id of its last item ("<step>.<id>").
CURSOR = re.compile(r"^(\d{1,9})\.(\d{1,18})$")
EXPORT_PAGE = 500


class RolloutService:
    def __init__(self, engine: Engine, runs: RunService) -> None:
        self._engine = engine
        self._runs = runs

    def page(self, run_id: str, filters: Filters, limit: int, cursor: str | None) -> RolloutPageOut:
        """Up to `limit` episodes in step order, after `cursor`; 404 for an unknown run, 422
        naming the field for a bad cursor or an empty reward range."""
        run = self._runs.row(run_id)
        after = parse_cursor(cursor)
        low, high = filters.min_reward, filters.max_reward
        if low is not None and high is not None and low > high:
            raise InvalidValue(
                f"min_reward: {low:g} is above max_reward {high:g}; give a range whose minimum "
                "is at most its maximum."
            )
        with read_session(self._engine) as session:
            rows = rollout_store.page(session, run.id, filters, limit + 1, after)
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = f"{rows[-1].step}.{rows[-1].id}" if more else None
        return RolloutPageOut(run_id=run.id, items=[item(r) for r in rows], next_cursor=next_cursor)

    def steps(self, run_id: str) -> RolloutStepsOut:
        run = self._runs.row(run_id)
        config = json.loads(run.config_json)
        with read_session(self._engine) as session:
            found = rollout_store.steps(session, run.id)
        return RolloutStepsOut(
            run_id=run.id,
            rollouts_per_step=rollouts.per_step(config),
            rollouts_max_mb=rollouts.max_mb(config),
            size_bytes=sum(s.size for s in found),
            steps=[step_out(s) for s in found],
        )

    def export_lines(self, run_id: str) -> Iterator[str]:
        """Every recorded episode of the run as JSON lines (the API's items), in step order."""
        after: tuple[int, int] | None = None
        while True:
            with read_session(self._engine) as session:
                rows = rollout_store.page(session, run_id, Filters(), EXPORT_PAGE, after)
            for row in rows:
                yield item(row).model_dump_json() + "\n"
            if len(rows) < EXPORT_PAGE:
                return
            after = (rows[-1].step, int(rows[-1].id or 0))


def parse_cursor(cursor: str | None) -> tuple[int, int] | None:
    """A page's cursor; none (or empty: a client that sends `cursor=` for none) is the first."""
    if not cursor:
        return None
    found = CURSOR.match(cursor)
    if found is None:
        raise InvalidValue(
            f"cursor: {cursor[:40]!r} is not a cursor; pass the next_cursor of the page before, "
            "or leave cursor out for the first page."
        )
    return int(found[1]), int(found[2])


def item(row: Rollout) -> RolloutOut:
    body = json.loads(row.body_json)
    return RolloutOut(
        step=row.step,
        kind=row.kind,
        group=row.group_index,
        index=row.position,
        reward=row.reward,
        advantage=row.advantage,
        picked=row.picked,
        prompt_key=row.prompt_key,
        prompt=body.get("prompt", ""),
        completion=body.get("completion", ""),
        finish_reason=body.get("finish_reason"),
        prompt_tokens=body.get("prompt_tokens", 0),
        completion_tokens=body.get("completion_tokens", 0),
        logprob_mean=body.get("logprob_mean"),
        turns=body.get("turns", 1),
        source=body.get("source", ""),
        trained=body.get("trained", True),
        metrics=body.get("metrics") or {},
        segments=[SegmentOut(**s) for s in body.get("segments") or []],
        messages=body.get("messages"),
    )


def step_out(row: RolloutStep) -> RolloutStepOut:
    return RolloutStepOut(
        step=row.step,
        kind=row.kind,
        sampled=row.sampled,
        recorded=row.recorded,
        kept=row.kept,
        size_bytes=row.size,
        reward_mean=row.reward_mean,
        reward_min=row.reward_min,
        reward_max=row.reward_max,
        metrics=json.loads(row.metrics_json or "{}"),
        note=row.note,
    )
