"""A finished run's recorded episodes, written to the database as a runner writes them, for the
tests that read rollouts (REST, MCP, `rlctl`, the dashboard)."""

from __future__ import annotations

import json

from sqlalchemy.engine import Engine

from core import rollout_store
from core.db import write_session
from core.models import Run, RunStatus
from core.rollouts import RolloutRecord, Segment, pick

RUN = "r-0000beef"


def episode(index: int, reward: float | None, group: int = 0, prompt: str = "") -> RolloutRecord:
    prompt = prompt or f"What is {group} + {group}?"
    completion = f"answer {index}"
    return RolloutRecord(
        kind="episode",
        group=group,
        index=index,
        prompt=prompt,
        completion=completion,
        reward=reward,
        advantage=None if reward is None else reward - 0.5,
        segments=[
            Segment("env", prompt, 7),
            Segment("model", completion, 2, reward=reward, advantage=0.25),
        ],
        finish_reason="stop",
        prompt_tokens=7,
        completion_tokens=2,
        logprob_mean=-1.5,
        metrics={"correct": float(reward or 0)},
    )


def seed_run(
    engine: Engine,
    run_id: str,
    steps: dict[int, list[RolloutRecord]],
    *,
    environment: str = "arithmetic",
    per_step: int = 256,
) -> None:
    """A finished run's row and the record of its steps, as a runner writes them."""
    with write_session(engine) as session:
        session.add(
            Run(
                id=run_id,
                environment=environment,
                status=RunStatus.succeeded,
                config_json=json.dumps({"model_name": "tiny-random"}),
                config_hash="h",
                run_dir="/nowhere",
                step=max(steps, default=0),
                total_steps=max(steps, default=0),
            )
        )
    for step, records in steps.items():
        rollout_store.write_step(
            engine, run_id, step, pick(records, per_step, step), sampled=records, max_bytes=10**9
        )


def two_steps() -> dict[int, list[RolloutRecord]]:
    return {
        1: [episode(i, float(i % 2), group=i // 4) for i in range(8)],
        2: [episode(i, 1.0, group=i // 4) for i in range(8)],
    }
