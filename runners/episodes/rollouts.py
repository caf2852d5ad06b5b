"""Episodes: playing one, collecting a batch, and the metrics they yield (DESIGN §7).

Collection keeps at most `concurrency` episodes in flight and starts the next episode the
moment one ends (no waiting for a wave).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from core.engine_client import EngineLost
from environments.base import BaseEnv, Split
from runners.train import torch_free

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
    sequence_id: str | None = None  # the sampler's id for the action (Completion.sequence_id)


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

    def lose(self, spec: EpisodeSpec, exc: Exception) -> None:
        """An episode lost to its environment or sampler: counted (by group too), logged, and
        its error kept if among the first five."""
        self.failed += 1
        self.failed_by_group[spec.group] = self.failed_by_group.get(spec.group, 0) + 1
        if len(self.errors) < 5:
            self.errors.append(torch_free.advice(exc) or f"{type(exc).__name__}: {exc}")
        log.warning("episode failed (group %s, seed %s): %s", spec.group, spec.seed, exc)


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
            tokens, logprobs, sequence_id = await _sample(policy, prompt)
            result = await env.step(decode(tokens))
            transitions.append(
                Transition(
                    prompt,
                    tokens,
                    logprobs,
                    float(result.reward),
                    result.done,
                    dict(result.metrics),
                    sequence_id,
                )
            )
            if result.done:
                break
            observation = result.observation
        return Episode(spec.group, spec.seed, transitions, spec.source)
    finally:
        await env.close()


async def _sample(policy: Policy, prompt: list[int]) -> tuple[list[int], list[float], str | None]:
    """The action, its logprobs and, from a policy that gives it (SamplerPolicy.complete), the
    sampler's id for it."""
    complete = getattr(policy, "complete", None)
    if complete is None:
        tokens, logprobs = await policy.sample(prompt)
        return tokens, logprobs, None
    completion = await complete(prompt)
    return completion.tokens, completion.logprobs, completion.sequence_id


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
    """Run episodes from `specs` with `concurrency` workers until `specs` ends or `enough`. A
    failed sample or environment error drops that episode (counted), never the batch; the
    engine host's going (EngineLost) ends the collection."""
    out = Collected(episodes=[])
    done = asyncio.Event()
    numbered = enumerate(specs)  # the k-th spec is the k-th episode, whichever worker runs it
    own = getattr(policy, "episode", None)

    async def worker() -> None:
        while not done.is_set():
            index, spec = next(numbered, (0, None))
            if spec is None:
                return
            try:
                episode_policy = own(index) if own is not None else policy
                episode = await run_episode(spec, episode_policy, render, decode, split)
            except (asyncio.CancelledError, EngineLost):
                raise  # the engine host went: not this episode's failure, the run's
            except Exception as exc:  # an environment or sampler failure loses one episode
                out.lose(spec, exc)
                continue
            out.episodes.append(episode)
            if enough(out):
                done.set()

    # Once `enough`, workers start nothing new but finish the episodes they have: cancelling
    # them would drop mostly long episodes and bias the batch towards short ones.
    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return out


def mean_return(episodes: list[Episode]) -> float | None:
    """The episodes' mean return (None without episodes)."""
    return sum(e.total_reward for e in episodes) / len(episodes) if episodes else None


def episode_metrics(episodes: list[Episode], prefix: str) -> dict[str, float]:
    """Correctness, mean return and what environments report per step, averaged per episode;
    with prefix "env" (a training step's batch) also the sampler's view (turns, action
    tokens), and no return: the reporter records that as the step's `reward/mean`."""
    if not episodes:
        return {f"{prefix}/num_episodes": 0}
    n = len(episodes)
    out = {
        f"{prefix}/percent_correct": sum(e.correct for e in episodes) / n,
        f"{prefix}/num_episodes": n,
    }
    if prefix != "env":
        out[f"{prefix}/reward_mean"] = sum(e.total_reward for e in episodes) / n
    totals: dict[str, float] = {}
    for episode in episodes:
        for t in episode.transitions:
            for key, value in t.metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value)
    out.update({f"{prefix}/{key}": total / n for key, total in totals.items()})
    if prefix == "env":
        out["sampler/num_episodes"] = n
        out["sampler/num_turns_per_episode"] = sum(len(e.transitions) for e in episodes) / n
        out["sampler/action_num_tokens"] = (
            sum(len(t.action_tokens) for e in episodes for t in e.transitions) / n
        )
    return out
