"""A step's kept rollouts as a W&B table (logged in the step's row when W&B is on)."""

from __future__ import annotations

from typing import Any

from core.rollout_recorder import Kept

COLUMNS: list[str | int] = [
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


def wandb_table(kept: Kept) -> Any:
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
        for r, how in kept
    ]
    return wandb.Table(columns=COLUMNS, data=rows)
