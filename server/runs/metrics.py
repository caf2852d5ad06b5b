"""A run's metrics: from W&B when the run logs there and W&B answers, else the database.

Answers say which (`metrics_source`) and, when W&B was not used, why (`metrics_note`).
History and checkpoints always come from the database, which holds every step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from core.db import read_session
from core.models import Checkpoint, Metric, Run, iso
from server.runs.schemas import CheckpointOut
from server.runs.wandb_reader import WandbReader

# Names in answers (the reference client's) -> metric keys the runner logs (DESIGN §7).
SUMMARY_KEYS = {
    "reward_mean": "reward/mean",
    "loss": "train/loss",
    "percent_correct": "env/percent_correct",
    "eval_percent_correct": "eval/percent_correct",
}


@dataclass
class Latest:
    metrics: dict[str, Any]
    source: str
    note: str | None = None


class MetricsService:
    def __init__(self, engine: Engine, wandb: WandbReader | None = None) -> None:
        self._engine = engine
        self._wandb = wandb

    def start(self) -> None:
        """Warm the W&B client in the background when a key is set (import, log in)."""
        if self._wandb is not None and self._wandb.configured:
            self._wandb.warm_up()

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.close()

    def latest(self, run: Run) -> Latest:
        note = None
        if run.wandb_path and self._wandb is not None:
            result = self._wandb.read(run.id, run.wandb_path)
            if result.ok and result.summary is not None:
                step = int(result.summary.get("_step", run.step) or 0)
                return Latest(summarize(result.summary, step), "wandb", result.note)
            note = f"{result.note}; showing the local record" if result.note else None
        values = self.latest_values(run.id)
        return Latest(metrics=summarize(values, run.step), source="local", note=note)

    def latest_values(self, run_id: str, scan_rows: int = 200) -> dict[str, Any]:
        """The most recent value of every key, from the last `scan_rows` metric rows."""
        latest: dict[str, Any] = {}
        for row in self._newest_rows(run_id, scan_rows):
            for key, value in json.loads(row.values_json).items():
                latest.setdefault(key, value)
        return latest

    def latest_rewards(self, run_ids: list[str]) -> dict[str, float | None]:
        """Each run's mean reward at its newest step, read from the rows of that step only."""
        if not run_ids:
            return {}
        key = SUMMARY_KEYS["reward_mean"]
        with read_session(self._engine) as session:
            rows = session.exec(
                select(Metric.run_id, Metric.values_json)
                .join(Run, col(Run.id) == col(Metric.run_id))
                .where(col(Run.id).in_(run_ids), col(Metric.step) == col(Run.step))
                .order_by(col(Metric.id))
            ).all()
        rewards: dict[str, float | None] = {}
        for run_id, values_json in rows:
            value = json.loads(values_json).get(key)
            if value is not None:
                rewards[run_id] = value
        return rewards

    def history(
        self,
        run_id: str,
        keys: list[str] | None = None,
        limit: int = 1000,
        max_points: int | None = None,
    ) -> list[dict[str, Any]]:
        """Metric rows in step order (the last `limit`), keeping only `keys` when given; with
        `max_points`, each key's series thinned to at most that many points (evenly spaced,
        its first and last kept), so a sparse series (evaluations) keeps all its points."""
        out = []
        for row in reversed(self._newest_rows(run_id, limit)):
            values = json.loads(row.values_json)
            if keys is not None:
                values = {k: v for k, v in values.items() if k in keys}
                if not values:
                    continue
            out.append({"step": row.step, **values})
        if max_points is not None:
            out = thin(out, max_points)
        return out

    def _newest_rows(self, run_id: str, limit: int) -> list[Metric]:
        with read_session(self._engine) as session:
            return list(
                session.exec(
                    select(Metric)
                    .where(Metric.run_id == run_id)
                    .order_by(col(Metric.step).desc(), col(Metric.id).desc())
                    .limit(limit)
                ).all()
            )

    def checkpoints(self, run_id: str) -> list[CheckpointOut]:
        with read_session(self._engine) as session:
            rows = session.exec(
                select(Checkpoint)
                .where(Checkpoint.run_id == run_id)
                .order_by(col(Checkpoint.step), col(Checkpoint.id))
            ).all()
        return [
            CheckpointOut(
                step=r.step, kind=r.kind, name=r.name, path=r.path, created_at=iso(r.created_at)
            )
            for r in rows
        ]


def summarize(values: dict[str, Any], step: int) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step}
    for name, key in SUMMARY_KEYS.items():
        out[name] = values.get(key)
    return out


def thin(rows: list[dict[str, Any]], max_points: int) -> list[dict[str, Any]]:
    """Rows with each metric key's series cut to at most `max_points` evenly spaced points."""
    series: dict[str, list[int]] = {}  # key -> indexes of the rows that hold it
    for index, row in enumerate(rows):
        for key in row:
            if key != "step":
                series.setdefault(key, []).append(index)
    kept: dict[int, dict[str, Any]] = {}
    for key, indexes in series.items():
        if len(indexes) > max_points:
            last = len(indexes) - 1
            picks = sorted({round(i * last / (max_points - 1)) for i in range(max_points)})
            indexes = [indexes[p] for p in picks] if max_points > 1 else [indexes[-1]]
        for index in indexes:
            kept.setdefault(index, {"step": rows[index]["step"]})[key] = rows[index][key]
    return [kept[index] for index in sorted(kept)]
