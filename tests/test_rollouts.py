"""The native loop's episodes through the learner (advantages and datums against hand-worked
numbers); collection concurrency and failures."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from environments.base import BaseEnv, StepResult
from runners.episodes.policy import SamplerPolicy
from runners.episodes.rollouts import Episode, EpisodeSpec, Transition, collect
from runners.train.learner import Advantaged, assign_advantages, datum, discounted_returns
from runners.train.loop import sequences_of


def ep(group: int, rewards: list[float]) -> Episode:
    return Episode(
        group,
        0,
        [Transition([1, 2], [3], [-0.5], r, i == len(rewards) - 1) for i, r in enumerate(rewards)],
    )


def grpo_advantages(episodes: list[Episode], scale_by_std: bool = False) -> Advantaged:
    return assign_advantages(sequences_of(episodes), "grpo", scale_by_std=scale_by_std)


def rebn_advantages(episodes: list[Episode], gamma: float, limit: int | None = None) -> list[float]:
    advantaged = assign_advantages(sequences_of(episodes), "rebn", gamma=gamma, limit=limit)
    return [action_advantage(s.advantages) for s in advantaged.sequences]


def action_advantage(advantages: list[float] | None) -> float:
    """The advantage on a turn's (one) action token, the last of its sequence."""
    assert advantages is not None
    return advantages[-1]


def test_grpo_centres_each_group_and_drops_flat_groups() -> None:
    episodes = [ep(0, [1.0]), ep(0, [0.0]), ep(0, [0.5]), ep(0, [0.5]), ep(1, [0.2]), ep(1, [0.2])]
    advantaged = grpo_advantages(episodes)
    # Group 0: mean 0.5 -> advantages 0.5, -0.5, 0, 0. Group 1 is flat: dropped.
    assert advantaged.dropped_groups == 1
    values = [action_advantage(s.advantages) for s in advantaged.sequences]
    assert values == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_grpo_std_scaling_and_multi_turn_returns() -> None:
    episodes = [ep(0, [0.0, 1.0]), ep(0, [0.0, 0.0])]  # returns 1 and 0
    advantaged = grpo_advantages(episodes, scale_by_std=True)
    # mean 0.5, population std 0.5: advantages +-1 (to 1e-6), on every turn of each episode.
    values = [action_advantage(s.advantages) for s in advantaged.sequences]
    assert [round(v, 4) for v in values] == [1.0, 1.0, -1.0, -1.0]


def test_discounted_returns_match_the_reference() -> None:
    assert discounted_returns([0, 0, 0, 1], 0.9) == pytest.approx([0.729, 0.81, 0.9, 1.0])


def test_rebn_normalises_returns_across_the_batch() -> None:
    episodes = [ep(0, [0.0, 1.0]), ep(1, [0.0])]
    values = rebn_advantages(episodes, gamma=0.5)
    # Returns: 0.5, 1.0, 0.0; mean 0.5; sample std 0.5 -> z = 0, 1, -1.
    assert values == pytest.approx([0.0, 1.0, -1.0], abs=1e-6)
    assert rebn_advantages([ep(0, [1.0]), ep(1, [1.0])], gamma=0.9) == []


def test_rebn_subsamples_to_the_batch_size() -> None:
    episodes = [ep(i, [float(i)]) for i in range(10)]
    assert len(rebn_advantages(episodes, gamma=0.9, limit=4)) == 4


def test_datum_puts_advantage_on_action_tokens_only() -> None:
    t = Transition([10, 11, 12], [20, 21], [-0.1, -0.2], 1.0, True)
    other = Transition([10, 11, 12], [22, 23], [-0.3, -0.4], 0.3, True)
    first = assign_advantages(sequences_of([Episode(0, 0, [t]), Episode(0, 0, [other])]), "grpo")
    made = datum(first.sequences[0])  # advantage 1.0 - 0.65
    assert made is not None
    assert made.model_input.to_ints() == [10, 11, 12, 20]
    inputs = made.loss_fn_inputs
    assert inputs["target_tokens"].tolist() == [11, 12, 20, 21]
    assert inputs["logprobs"].tolist() == pytest.approx([0.0, 0.0, -0.1, -0.2])
    assert inputs["advantages"].tolist() == pytest.approx([0.0, 0.0, 0.35, 0.35])
    empty = sequences_of([Episode(0, 0, [Transition([1], [], [], 0.0, True)])])[0]
    empty.advantages = [0.0]
    assert datum(empty) is None


class CountingEnv(BaseEnv):
    """Episodes of `seed % 3 + 1` turns; the env with seed 13 raises."""

    active = 0
    most = 0

    async def reset(self, seed: int, split: str = "train") -> str:
        if seed == 13:
            raise RuntimeError("env exploded")
        self.turns_left = seed % 3 + 1
        return "go"

    async def step(self, action: str) -> StepResult:
        self.turns_left -= 1
        return StepResult("go", 1.0 if action == "x" else 0.0, self.turns_left == 0)


class SlowPolicy:
    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0

    async def sample(self, prompt_tokens: list[int]) -> tuple[list[int], list[float]]:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        return [1], [math.log(0.5)]


def test_collect_bounds_concurrency_and_drops_failed_episodes() -> None:
    policy = SlowPolicy()
    specs = iter([EpisodeSpec(g, seed, CountingEnv) for g, seed in enumerate(range(10, 20))])
    got = asyncio.run(collect(specs, policy, lambda o: [1, 2], lambda t: "x", concurrency=3))
    assert policy.most == 3
    assert got.failed == 1 and "env exploded" in got.errors[0]
    assert len(got.episodes) == 9
    assert sorted(len(e.transitions) for e in got.episodes) == sorted(
        s % 3 + 1 for s in range(10, 20) if s != 13
    )


def test_collect_stops_when_enough() -> None:
    def forever():
        g = 0
        while True:
            yield EpisodeSpec(g, 1, CountingEnv)
            g += 1

    got = asyncio.run(
        collect(
            forever(),
            SlowPolicy(),
            lambda o: [1],
            lambda t: "x",
            concurrency=4,
            enough=lambda c: c.transitions >= 10,
        )
    )
    # Episodes in flight when the batch filled up still finish (up to 3 turns each).
    assert 10 <= got.transitions <= 10 + 3 * 3


class TurnsEnv(BaseEnv):
    """Episode `seed` plays seed % 3 + 1 turns; each observation names its episode and turn."""

    async def reset(self, seed: int, split: str = "train") -> str:
        self.seed, self.turn = seed, 0
        return f"{seed}:0"

    async def step(self, action: str) -> StepResult:
        self.turn += 1
        return StepResult(f"{self.seed}:{self.turn}", 0.0, self.turn == self.seed % 3 + 1)


class SeedRecordingSampler:
    """A sampling client that notes each call's seed by (episode, turn) and answers after a
    delay of the caller's choosing (so concurrent episodes reach it in another order)."""

    def __init__(self, delay: Callable[[int], float]) -> None:
        self.delay = delay
        self.seeds: dict[tuple[int, ...], int] = {}

    async def sample(self, prompt: Any, num_samples: int, sampling_params: Any) -> Any:
        key = tuple(prompt.to_ints())
        self.seeds[key] = sampling_params.seed
        await asyncio.sleep(self.delay(key[0]))
        sequence = SimpleNamespace(tokens=[1], logprobs=[-0.5], stop_reason="stop")
        return SimpleNamespace(sequences=[sequence])


def test_an_episode_samples_with_its_own_seeds_whatever_order_episodes_call_in() -> None:
    def seeds_when(delay: Callable[[int], float]) -> dict[tuple[int, ...], int]:
        client = SeedRecordingSampler(delay)
        policy = SamplerPolicy(
            client, max_tokens=4, temperature=1.0, top_p=1.0, top_k=-1, stop=[], seed=1000
        )
        specs = iter([EpisodeSpec(0, seed, TurnsEnv) for seed in range(6)])
        render = lambda o: [int(part) for part in o.split(":")]  # noqa: E731
        asyncio.run(collect(specs, policy, render, lambda t: "x", concurrency=6))
        return client.seeds

    early_first = seeds_when(lambda episode: 0.001 * episode)
    late_first = seeds_when(lambda episode: 0.001 * (6 - episode))
    assert early_first == late_first
    # The k-th episode's first turn has seed + k, as calls counted in order gave it.
    assert [early_first[(k, 0)] for k in range(6)] == [1000 + k for k in range(6)]
    assert early_first[(2, 2)] == 1002 + (2 << 32)
