"""A step's kept rollouts as a W&B table (logged beside the step's metrics when W&B is on)."""

from __future__ import annotations

from typing import Any

from core.rollouts import Picked, RolloutRecord

COLUMNS = [
    "group",
    "index",
    "reward",
    "advantage",
    "finish_reason",
    "completion_tokens",
    "prompt",
    "completion",
    "picked",
]


def wandb_table(picked: list[tuple[RolloutRecord, Picked]]) -> Any:
    import wandb

    rows = [
        [
            r.group,
            r.index,
            r.reward,
            r.advantage,
            r.finish_reason,
            r.completion_tokens,
            r.prompt,
            r.completion,
            how,
        ]
        for r, how in picked
    ]
    return wandb.Table(columns=COLUMNS, data=rows)
