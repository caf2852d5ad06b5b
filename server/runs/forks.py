"""Forks: a new run that starts from another run's state checkpoint (weights and optimizer
state) under a changed config, recording its parent and continuing the parent's step count."""

from __future__ import annotations

from typing import Any

from core.models import RunStatus
from server.environments.configs import ConfigService
from server.errors import InvalidValue
from server.runs.schemas import RunForkedOut
from server.runs.service import RunService, refuse_session

# Fields that fix the shape of the checkpoint's weights: a fork cannot change them.
FIXED_BY_CHECKPOINT = ("model_name", "lora_rank", "backend")


class ForkService:
    def __init__(self, runs: RunService, configs: ConfigService) -> None:
        self._runs = runs
        self._configs = configs

    def fork(
        self, run_id: str, overrides: dict[str, Any], checkpoint_step: int | None = None
    ) -> RunForkedOut:
        """Queue a new run from `run_id`'s state checkpoint at `checkpoint_step` (its newest
        loadable one by default) with the parent's frozen config plus `overrides`."""
        parent = self._runs.row(run_id)
        refuse_session(parent, "forked")
        _refuse_fixed_fields(overrides)
        checkpoint = self._runs.state_checkpoint(run_id, checkpoint_step, verb="fork from")
        spec = self._runs.spec(parent)
        base = {k: v for k, v in spec.config.items() if k != "resume_from"}
        total = overrides.get("total_steps", parent.total_steps)
        if isinstance(total, int) and total <= checkpoint.step:
            whose = "" if "total_steps" in overrides else " (the parent's)"
            raise InvalidValue(
                f"total_steps: {total}{whose} is not past the checkpoint's step "
                f"{checkpoint.step}, so the fork would have nothing to train; give total_steps > "
                f"{checkpoint.step} (steps continue from "
                f"{checkpoint.step + 1})."
            )
        entry, config = self._configs.revalidate(
            parent.environment, base, {**overrides, "resume_from": checkpoint.path}
        )
        planned = self._runs.plan(
            entry,
            config,
            step=checkpoint.step,
            parent_run_id=parent.id,
            parent_step=checkpoint.step,
        )
        (child,) = self._runs.launch([planned])
        return RunForkedOut(
            run_id=child,
            status=RunStatus.queued.value,
            parent_run_id=parent.id,
            parent_step=checkpoint.step,
            resume_from=checkpoint.path,
        )


def _refuse_fixed_fields(overrides: dict[str, Any]) -> None:
    """InvalidValue for an override a fork cannot take: a field its checkpoint fixes, or
    resume_from (the fork's checkpoint is its parent's)."""
    for name in FIXED_BY_CHECKPOINT:
        if name in overrides:
            raise InvalidValue(
                f"{name}: a fork continues the parent's weights, so it keeps the parent's "
                f"{name}; leave it out, or start a new run (POST /runs) to change it."
            )
    if "resume_from" in overrides:
        raise InvalidValue(
            "resume_from: a fork starts from its parent's checkpoint; choose which with "
            "checkpoint_step instead."
        )
