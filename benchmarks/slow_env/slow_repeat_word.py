"""repeat_word whose every episode waits 50 ms for its environment before it is scored, as one
that calls a tool or a remote service does: benchmarks/algorithms.py times sampling ahead of
training (max_steps_off_policy) against it. Discovered with RLCS_ENV_DIRS=benchmarks/slow_env.
"""

from __future__ import annotations

import asyncio

from environments.base import StepResult
from environments.repeat_word import RepeatWordEnv

WAIT_S = 0.05


class SlowRepeatWordEnv(RepeatWordEnv):
    """Repeat the given word exactly; each answer waits 50 ms before it is scored."""

    name = "slow_repeat_word"

    async def step(self, action: str) -> StepResult:
        await asyncio.sleep(WAIT_S)
        return await super().step(action)
