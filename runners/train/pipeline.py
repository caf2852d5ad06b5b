"""Sampling ahead of training (`max_steps_off_policy`, DESIGN §7): a producer task samples the
batch of step k as soon as the newest published policy is at most `bound` steps behind it
(policy k - 1 - bound or newer), while earlier steps train; each step takes its batch from a
queue. Bound 0 is the synchronous loop: step k's batch is sampled from policy k - 1, after
step k - 1 trained.

    producer:  [sample k+1 from policy k-1] [sample k+2 from policy k] ...     (bound 1)
    learner:   [train k              ] publish k [train k+1           ] publish k+1
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

B = TypeVar("B")


@dataclass
class Produced(Generic[B]):
    step: int  # the step that trains it
    policy_step: int  # the policy that sampled it (optimizer steps taken then)
    batch: B
    sample_s: float  # how long sampling it took


# (step, policy step, that policy's sampler) -> the step's batch
Produce = Callable[[int, int, Any], Awaitable[B]]


class Pipeline(Generic[B]):
    def __init__(
        self,
        produce: Produce[B],
        *,
        bound: int,
        steps: range,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._produce = produce
        self.bound = bound
        self._steps = steps
        self._clock = clock
        # At most bound + 1 batches exist ahead of the policy: the queue needs no cap.
        self._queue: asyncio.Queue[Produced[B] | BaseException] = asyncio.Queue()
        self._published = asyncio.Condition()
        self._policy: tuple[int, Any] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, policy_step: int, sampler: Any) -> None:
        """Sampling begins from `sampler`, the policy after `policy_step` optimizer steps."""
        self._policy = (policy_step, sampler)
        self._task = asyncio.create_task(self._run(), name="sampling-ahead")

    async def publish(self, policy_step: int, sampler: Any) -> None:
        """The newest policy: batches started from now on sample from it."""
        async with self._published:
            self._policy = (policy_step, sampler)
            self._published.notify_all()

    async def take(self, step: int) -> Produced[B]:
        """Step `step`'s batch, once sampled (a sampling failure is raised here)."""
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        assert item.step == step, f"batch of step {item.step} taken for step {step}"
        return item

    async def close(self) -> None:
        """Sampling still running is cancelled (its episodes end with it)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        try:
            for step in self._steps:
                oldest = step - 1 - self.bound  # the oldest policy that may sample this step
                async with self._published:
                    await self._published.wait_for(partial(self._newer_than, oldest))
                    assert self._policy is not None
                    policy_step, sampler = self._policy
                started = self._clock()
                batch = await self._produce(step, policy_step, sampler)
                self._queue.put_nowait(Produced(step, policy_step, batch, self._clock() - started))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the step that needs the batch fails the run with it
            self._queue.put_nowait(exc)

    def _newer_than(self, oldest: int) -> bool:
        assert self._policy is not None
        return self._policy[0] >= oldest
