"""Advantages: how much better than expected each transition's action was (DESIGN §7).

`grpo` compares an episode's return with its group's; `rebn` normalises per-turn discounted
returns across the batch, as the GEM reference does.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from runners.episodes.rollouts import Episode, Transition


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
