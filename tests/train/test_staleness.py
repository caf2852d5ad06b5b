"""Sampling ahead of training (runners/train/pipeline.py) with an injected producer and step
counter, and the staleness bound on groups (runners/train/staleness.py)."""

from __future__ import annotations

import asyncio

import pytest

from runners.train import staleness
from runners.train.learner import Sequence
from runners.train.pipeline import Pipeline


def tagged(group: int, policy_step: int | None) -> Sequence:
    return Sequence(
        tokens=[1, 2],
        trained=[False, True],
        logprobs=[0.0, -0.5],
        reward=0.0,
        group=group,
        sample=group,
        meta={staleness.POLICY_STEP: policy_step},
    )


def test_a_group_is_as_stale_as_its_oldest_sequence_and_dropped_past_the_bound() -> None:
    # Step 10 trains policy 9: samples of policy 9 are on policy, of policy 7 two steps off.
    batch = [
        tagged(0, 9),
        tagged(0, 9),
        tagged(1, 8),
        tagged(1, 7),  # group 1: 2 steps off (its oldest)
        tagged(2, 6),  # 3 steps off
        tagged(3, None),  # not known: kept, counted apart
    ]
    fresh = staleness.bound(batch, step=10, limit=2)
    assert [s.group for s in fresh.sequences] == [0, 0, 1, 1, 3]
    assert fresh.metrics == {
        "sampler/stale_groups_dropped": 1.0,
        "sampler/steps_off_policy": (0 + 2 + 3) / 3,
        "sampler/steps_off_policy_max": 3.0,
        "sampler/untagged_groups": 1.0,
    }
    assert staleness.bound(batch, step=10, limit=3).metrics["sampler/stale_groups_dropped"] == 0
    on_policy = staleness.bound([tagged(0, 9)], step=10, limit=0)
    assert on_policy.metrics["sampler/steps_off_policy_max"] == 0
    assert len(on_policy.sequences) == 1


class Trainer:
    """Drives a pipeline as the runner does, recording when each batch was sampled."""

    def __init__(self, bound: int, steps: int) -> None:
        self.log: list[str] = []
        self.hold: dict[int, asyncio.Event] = {}  # a step's sampling waits for its event

        async def produce(step: int, policy_step: int, sampler: str) -> str:
            self.log.append(f"sample {step} from {sampler}")
            if step in self.hold:
                await self.hold[step].wait()
            return f"batch {step}"

        self.pipeline: Pipeline[str] = Pipeline(produce, bound=bound, steps=range(1, steps + 1))

    async def train(self, step: int) -> tuple[int, str]:
        if step > 1:
            await self.pipeline.publish(step - 1, f"policy {step - 1}")
        produced = await self.pipeline.take(step)
        self.log.append(f"train {step}")
        return produced.policy_step, produced.batch


async def drive(bound: int, steps: int) -> tuple[list[str], list[tuple[int, str]]]:
    trainer = Trainer(bound, steps)
    trainer.pipeline.start(0, "policy 0")
    got = []
    for step in range(1, steps + 1):
        got.append(await trainer.train(step))
        await asyncio.sleep(0)  # let the producer run as far as it may
    await trainer.pipeline.close()
    return trainer.log, got


def test_bound_zero_samples_each_step_after_the_previous_one_trained() -> None:
    log, got = asyncio.run(drive(bound=0, steps=3))
    assert log == [
        "sample 1 from policy 0",
        "train 1",
        "sample 2 from policy 1",
        "train 2",
        "sample 3 from policy 2",
        "train 3",
    ]
    assert got == [(0, "batch 1"), (1, "batch 2"), (2, "batch 3")]


def test_bound_two_samples_up_to_two_steps_ahead_of_the_policy() -> None:
    log, got = asyncio.run(drive(bound=2, steps=5))
    # Before step 1 trains, steps 1-3 are sampled from policy 0 (step 3 trains policy 2:
    # policy 0 is 2 steps off); step 4 needs policy 1, published when step 2 starts.
    assert log[:4] == [
        "sample 1 from policy 0",
        "sample 2 from policy 0",
        "sample 3 from policy 0",
        "train 1",
    ]
    assert "sample 4 from policy 1" in log
    assert [p for p, _ in got] == [0, 0, 0, 1, 2]
    for step, (policy, _) in enumerate(got, start=1):
        assert staleness.steps_off_policy(step, policy) <= 2


def test_a_sampling_failure_fails_the_step_that_needs_it() -> None:
    async def produce(step: int, policy_step: int, sampler: object) -> str:
        raise RuntimeError(f"every episode of step {step} failed")

    async def go() -> None:
        pipeline: Pipeline[str] = Pipeline(produce, bound=1, steps=range(1, 3))
        pipeline.start(0, None)
        with pytest.raises(RuntimeError, match="step 1 failed"):
            await pipeline.take(1)
        await pipeline.close()

    asyncio.run(go())


def test_close_cancels_the_sampling_in_flight() -> None:
    async def go() -> None:
        trainer = Trainer(bound=1, steps=4)
        trainer.hold[2] = asyncio.Event()  # step 2's sampling never ends by itself
        cancelled = asyncio.Event()
        produce = trainer.pipeline._produce

        async def watched(step: int, policy_step: int, sampler: str) -> str:
            try:
                return await produce(step, policy_step, sampler)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        trainer.pipeline._produce = watched
        trainer.pipeline.start(0, "policy 0")
        await trainer.train(1)
        assert "sample 2 from policy 0" in trainer.log  # sampled ahead of step 1's training
        await trainer.pipeline.close()  # a stop mid-flight
        assert cancelled.is_set()

    asyncio.run(go())


def test_the_run_normalises_over_the_groups_it_keeps() -> None:
    """The RL step every driver shares (RunnerBase.prepare): the bound first, then the
    advantages, so that ReBN's batch statistics are those of what trains (an Atropos run once
    took them over groups it then dropped)."""
    from tests.support.prepare import prepare

    def scored(group: int, policy_step: int, reward: float) -> Sequence:
        sequence = tagged(group, policy_step)
        sequence.reward, sequence.sample = reward, group * 10 + int(reward * 10)
        return sequence

    kept = [scored(0, 9, 1.0), scored(0, 9, 0.0)]
    stale = [scored(1, 5, 9.0), scored(1, 5, 8.0)]  # 4 steps off: dropped by a bound of 1
    prepared = prepare([*kept, *stale], "rebn", step=10, bound=1)
    assert [s.group for s in prepared.sequences] == [0, 0]
    values = [s.advantages[-1] for s in prepared.sequences if s.advantages]
    # z-scores of 1.0 and 0.0 alone (over all four they would be -0.75 and -0.97)
    assert values == pytest.approx([2**-0.5, -(2**-0.5)], abs=1e-4)
    assert prepared.off_policy["sampler/stale_groups_dropped"] == 1.0
