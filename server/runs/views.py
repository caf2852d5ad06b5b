"""How a run looks in answers: summaries for lists, details with progress, stall, metrics and
cost."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.engine import Row

from core.models import Run, RunStatus, iso, utcnow
from core.settings import Settings
from server.runs.metrics import MetricsService
from server.runs.pricing import Pricing
from server.runs.schemas import RunDetailOut, RunProgressOut, RunSummaryOut

# A Run, or a row of the columns a summary reads (runs.SUMMARY_COLUMNS).
RunColumns = Run | Row[Any]


class RunViews:
    def __init__(self, settings: Settings, metrics: MetricsService) -> None:
        self._settings = settings
        self._metrics = metrics
        self._pricing = Pricing.from_settings(settings)  # what a run's cost is in money

    def summary(self, run: RunColumns, reward_mean: float | None = None) -> RunSummaryOut:
        progress = self.progress(run)
        stalled, _ = self.stall(run, progress.time_per_step_s)
        out = _summary(run, reward_mean, progress, stalled)
        out.cost = self._pricing.brief(run, out.model_name)
        return out

    def detail(self, run: Run, queue: tuple[int, int] | None = None) -> RunDetailOut:
        status = RunStatus(run.status)
        latest = self._metrics.latest(run)
        progress = self.progress(run)
        stalled, stall_details = self.stall(run, progress.time_per_step_s)
        details = run.details
        if queue is not None:
            position, active = queue
            details = (
                f"waiting for a slot: {active} of {self._settings.concurrent_runs} runs "
                f"active (RLCS_MAX_CONCURRENT_RUNS); position {position} in the queue"
            )
        summary = _summary(run, latest.metrics.get("reward_mean"), progress, stalled)
        return RunDetailOut(
            **summary.model_dump(exclude={"cost"}),
            cost=self._pricing.cost(run, summary.model_name),
            metrics=latest.metrics,
            metrics_source=latest.source,
            metrics_note=latest.note,
            wandb_url=run.wandb_url,
            wandb_path=run.wandb_path,
            weights_path=run.weights_path,
            error=run.details if status == RunStatus.failed else None,
            details=details,
            exit_code=run.exit_code,
            pid=run.pid,
            config_hash=run.config_hash,
            config=json.loads(run.config_json),
            stall_details=stall_details,
            progress=progress,
            last_step_at=iso(run.last_step_at),
        )

    def progress(self, run: RunColumns) -> RunProgressOut:
        per_step = None
        eta = None
        # A fork starts at its parent's step: only the steps it trained itself took its time.
        done = run.step - (run.parent_step or 0)
        if run.started_at and run.last_step_at and done > 0:
            per_step = (run.last_step_at - run.started_at).total_seconds() / done
            if run.status == RunStatus.running:
                eta = max(0.0, per_step * (run.total_steps - run.step))
        fraction = run.step / run.total_steps if run.total_steps else 0.0
        return RunProgressOut(
            fraction=round(min(1.0, fraction), 4),
            time_per_step_s=round(per_step, 3) if per_step is not None else None,
            eta_s=round(eta, 1) if eta is not None else None,
        )

    def stall(self, run: RunColumns, per_step: float | None) -> tuple[bool, str | None]:
        """Stalled: running, and no step for far longer than its usual step time."""
        if run.status != RunStatus.running:
            return False, None
        since = run.last_step_at or run.started_at
        if since is None:
            return False, None
        quiet = (utcnow() - since).total_seconds()
        limit = self._settings.stall_min_s
        if per_step is not None:
            limit = max(limit, self._settings.stall_factor * per_step)
        if quiet <= limit:
            return False, None
        usual = f"usual step time {per_step:.1f} s" if per_step else "no step finished yet"
        return True, (
            f"no step for {quiet:.0f} s ({usual}; flagged after {limit:.0f} s). The process is "
            "alive; see GET /runs/{id}/logs, or stop it."
        )


def _summary(
    run: RunColumns, reward_mean: float | None, progress: RunProgressOut, stalled: bool
) -> RunSummaryOut:
    config = _named(run.config_json)
    return RunSummaryOut(
        run_id=run.id,
        environment=run.environment,
        status=RunStatus(run.status).value,
        step=run.step,
        total_steps=run.total_steps,
        attempt=run.attempt,
        failure_kind=run.failure_kind,
        created_at=iso(run.created_at),
        started_at=iso(run.started_at),
        finished_at=iso(run.finished_at),
        model_name=config.get("model_name"),
        display_name=config.get("display_name"),
        reward_mean=reward_mean,
        eta_s=progress.eta_s,
        stalled=stalled,
        sweep_id=run.sweep_id,
        parent_run_id=run.parent_run_id,
        parent_step=run.parent_step,
        source=run.source,
    )


def _named(config_json: str) -> dict[str, str]:
    """The names a run's frozen config gives: its model, and a Tinker session's display name
    (what its script sent to create_session)."""
    try:
        config = json.loads(config_json)
        session = config.get("session") if isinstance(config, dict) else None
    except ValueError:
        return {}
    if not isinstance(config, dict):
        return {}
    found = {
        "model_name": config.get("model_name"),
        "display_name": session.get("display_name") if isinstance(session, dict) else None,
    }
    return {k: v for k, v in found.items() if isinstance(v, str) and v}
