"""The RL step's data half as a run takes it (RunnerBase.prepare: the staleness bound, then the
run's advantages), for tests of a driver's batches without a run around them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

from core.training_config import TrainingConfig
from runners.train.learner import Sequence
from runners.train.run_base import Prepared, RunnerBase


def prepare(
    sequences: list[Sequence],
    advantage: Literal["grpo", "rebn"] = "grpo",
    scale_by_std: bool = False,
    *,
    step: int = 1,
    bound: int = 0,
    keep_flat: bool = False,
) -> Prepared:
    config = TrainingConfig(advantage=advantage, scale_advantage_by_std=scale_by_std)
    runner: Any = SimpleNamespace(training_config=config)
    return RunnerBase.prepare(runner, sequences, step, bound, keep_flat)
