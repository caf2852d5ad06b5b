"""Episode collection, advantages and datums: the data side of the RL loop (DESIGN §7).

Collection keeps at most `concurrency` episodes in flight and starts the next episode the
moment one ends (no waiting for a wave). Each turn of an episode becomes one datum.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from tinker import types

from environments.base import BaseEnv, Split

log = logging.getLogger(__name__)

MAX_TURNS = 64  # a guard against environments that never end an episode


class Policy(Protocol):
    async def sample(self, prompt_tokens: list[int]) -> tuple[list[int], list[float]]: ...


@dataclass
class Transition:
    prompt_tokens: list[int]
    action_tokens: list[int]
    action_logprobs: list[float]
    reward: float
    done: bool
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Episode:
    group: int
    seed: int
    transitions: list[Transition]
    source: str = ""  # which environment, in multi-environment runs

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.transitions)

    @property
    def correct(self) -> bool:
        """Ended with full reward (the share of these is `percent_correct`)."""
        return bool(self.transitions) and self.transitions[-1].reward >= 1.0 - 1e-9


@dataclass(frozen=True)
class EpisodeSpec:
    group: int
    seed: int
    make_env: Callable[[], BaseEnv]
    source: str = ""


@dataclass
class Collected:
    episodes: list[Episode]
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    failed_by_group: dict[int, int] = field(default_factory=dict)

    @property
    def transitions(self) -> int:
        return sum(len(e.transitions) for e in self.episodes)


async def run_episode(
    spec: EpisodeSpec,
    policy: Policy,
    render: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    split: Split = "train",
) -> Episode:
    env = spec.make_env()
    try:
        observation = await env.reset(spec.seed, split)
        transitions: list[Transition] = []
        for _ in range(MAX_TURNS):
            prompt = render(observation)
            tokens, logprobs = await policy.sample(prompt)
            result = await env.step(decode(tokens))
            transitions.append(
                Transition(
                    prompt,
                    tokens,
                    logprobs,
                    float(result.reward),
                    result.done,
                    dict(result.metrics),
                )
            )
            if result.done:
                break
            observation = result.observation
        return Episode(spec.group, spec.seed, transitions, spec.source)
    finally:
        await env.close()


async def collect(
    specs: Iterator[EpisodeSpec],
    policy: Policy,
    render: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    *,
    concurrency: int,
    enough: Callable[[Collected], bool] = lambda _: False,
    split: Split = "train",
) -> Collected:
    """Run episodes from `specs` with `concurrency` workers until `specs` ends or `enough`.

    A failed sample or environment error drops that episode (counted), never the batch.
    """
    out = Collected(episodes=[])
    done = asyncio.Event()

    async def worker() -> None:
        while not done.is_set():
            spec = next(specs, None)
            if spec is None:
                return
            try:
                episode = await run_episode(spec, policy, render, decode, split)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an environment or sampler failure loses one episode
                out.failed += 1
                out.failed_by_group[spec.group] = out.failed_by_group.get(spec.group, 0) + 1
                if len(out.errors) < 5:
                    out.errors.append(f"{type(exc).__name__}: {exc}")
                log.warning("episode failed (group %s, seed %s): %s", spec.group, spec.seed, exc)
                continue
            out.episodes.append(episode)
            if enough(out):
                done.set()

    # Once `enough`, workers start nothing new but finish the episodes they have: cancelling
    # them would drop mostly long episodes and bias the batch towards short ones.
    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return out


# Advantages ---------------------------------------------------------------------------------


@dataclass
class Weighted:
    """A transition and the advantage its action tokens get."""

    transition: Transition
    advantage: float


def grpo_advantages(
    episodes: list[Episode], scale_by_std: bool = False
) -> tuple[list[Weighted], int]:
    """Group-relative: each episode's return minus its group's mean (optionally / std).

    Groups whose returns are all equal carry no signal and are dropped; returns the weighted
    transitions and the number of dropped groups.
    """
    groups: dict[int, list[Episode]] = {}
    for episode in episodes:
        groups.setdefault(episode.group, []).append(episode)
    out: list[Weighted] = []
    dropped = 0
    for members in groups.values():
        returns = [e.total_reward for e in members]
        mean = sum(returns) / len(returns)
        std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
        if len(members) < 2 or std < 1e-8:
            dropped += 1
            continue
        for episode, ret in zip(members, returns, strict=True):
            adv = ret - mean
            if scale_by_std:
                adv /= std + 1e-6
            out.extend(Weighted(t, adv) for t in episode.transitions)
    return out, dropped


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    out = [0.0] * len(rewards)
    running = 0.0
    for i in reversed(range(len(rewards))):
        running = rewards[i] + gamma * running
        out[i] = running
    return out


def rebn_advantages(
    episodes: list[Episode], gamma: float, limit: int | None = None, seed: int = 0
) -> list[Weighted]:
    """Per-turn discounted returns, z-scored across the whole batch of transitions (ReBN).

    With more transitions than `limit`, a random subset of `limit` is kept (as the GEM
    reference does); if every return is equal there is no signal and nothing is returned.
    """
    pairs: list[tuple[Transition, float]] = []
    for episode in episodes:
        returns = discounted_returns([t.reward for t in episode.transitions], gamma)
        pairs.extend(zip(episode.transitions, returns, strict=True))
    if len(pairs) < 2:
        return []
    values = [r for _, r in pairs]
    mean = sum(values) / len(values)
    # Sample standard deviation, as torch.std computes it in the reference.
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    if std < 1e-8:
        return []
    weighted = [Weighted(t, (r - mean) / (std + 1e-9)) for t, r in pairs]
    if limit is not None and len(weighted) > limit:
        weighted = random.Random(seed).sample(weighted, limit)
    return weighted


# Datums -------------------------------------------------------------------------------------


def make_datum(item: Weighted) -> types.Datum | None:
    """Input = (prompt + action)[:-1], target = (prompt + action)[1:]; the advantage and the
    sampler's logprobs sit on the action tokens only (zeros on the prompt)."""
    t = item.transition
    if not t.action_tokens or not t.prompt_tokens:
        return None
    tokens = t.prompt_tokens + t.action_tokens
    prompt_part = len(t.prompt_tokens) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * prompt_part + [float(x) for x in t.action_logprobs],
            "advantages": [0.0] * prompt_part + [float(item.advantage)] * len(t.action_tokens),
        },
    )


def make_datums(items: list[Weighted]) -> tuple[list[types.Datum], list[Weighted]]:
    datums, kept = [], []
    for item in items:
        datum = make_datum(item)
        if datum is not None:
            datums.append(datum)
            kept.append(item)
    return datums, kept


def kl_metrics(kept: list[Weighted], outputs: list[dict[str, Any]]) -> dict[str, float]:
    """Sampler vs learner logprobs on the action tokens (as the reference script computes)."""
    diffs: list[float] = []
    sampled: list[float] = []
    for item, output in zip(kept, outputs, strict=True):
        n = len(item.transition.action_tokens)
        learner = output["logprobs"].tolist()[-n:]
        sampler = item.transition.action_logprobs
        sampled.extend(sampler)
        diffs.extend(q - p for q, p in zip(sampler, learner, strict=True))
    if not diffs:
        return {}
    return {
        "train/kl_sample_train_v1": sum(diffs) / len(diffs),
        "train/kl_sample_train_v2": 0.5 * sum(d * d for d in diffs) / len(diffs),
        "sampler/token_entropy": -sum(sampled) / len(sampled),
    }
