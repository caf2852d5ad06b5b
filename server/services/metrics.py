"""A run's metrics: the latest values and history from the database (W&B comes later)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from server.db import read_session
from server.models import Metric, Run

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
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def latest(self, run: Run) -> Latest:
        values = self.latest_values(run.id)
        return Latest(metrics=summarize(values, run.step), source="local")

    def latest_values(self, run_id: str, scan_rows: int = 200) -> dict[str, Any]:
        """The most recent value of every key, from the last `scan_rows` metric rows."""
        with read_session(self._engine) as session:
            rows = session.exec(
                select(Metric)
                .where(Metric.run_id == run_id)
                .order_by(col(Metric.step).desc(), col(Metric.id).desc())
                .limit(scan_rows)
            ).all()
        latest: dict[str, Any] = {}
        for row in rows:
            for key, value in json.loads(row.values_json).items():
                latest.setdefault(key, value)
        return latest


def summarize(values: dict[str, Any], step: int) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step}
    for name, key in SUMMARY_KEYS.items():
        out[name] = values.get(key)
    return out
