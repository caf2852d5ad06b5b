"""What a step plays over the run's environments: the training batch (GRPO groups, or a ReBN
count of transitions) and the held-out evaluation, and their metrics per environment."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from environments.base import EnvConfig
from runners.episodes.render import Renderer
from runners.episodes.rollouts import (
    Collected,
    Episode,
    EpisodeSpec,
    Policy,
    collect,
    episode_metrics,
)
from runners.episodes.sources import Mixer, Source
from runners.train.seeds import RunSeeds


class Collector:
    def __init__(self, sources: list[Source], renderer: Renderer, concurrency: int) -> None:
        self.sources = sources
        self.config: EnvConfig = sources[0].config  # the run's own environment leads
        self.renderer = renderer
        self.concurrency = concurrency
        self._mixer = Mixer(sources)

    async def train_batch(self, policy: Policy, step: int) -> Collected:
        cfg = self.config
        rng = random.Random(RunSeeds(cfg.seed).tasks(step))
        if cfg.advantage == "rebn":
            # ReBN counts transitions: episodes keep coming until the batch is full.
            endless = (self._mixer.next().spec(g, rng.randrange(2**31)) for g in itertools.count())
            return await self._collect(
                endless, policy, enough=lambda got: got.transitions >= cfg.batch_size
            )
        specs: list[EpisodeSpec] = []
        for group in range(cfg.batch_size):
            source, seed = self._mixer.next(), rng.randrange(2**31)
            specs.extend(source.spec(group, seed) for _ in range(source.group_size))
        return await self._collect(iter(specs), policy)

    async def eval_batch(self, policy: Policy) -> Collected:
        """One episode on each of `eval_num_tasks` held-out tasks of every environment."""
        tasks = range(self.config.eval_num_tasks)
        specs = [source.spec(i, i) for source in self.sources for i in tasks]
        return await self._collect(iter(specs), policy, split="eval")

    def usable(self, collected: Collected) -> list[Episode]:
        """Drop groups that lost more episodes than their environment tolerates
        (`max_failing_rollouts`, as OpenReward's trainer does)."""
        limits = {s.name: s.max_failing for s in self.sources}
        kept = []
        for episode in collected.episodes:
            limit = limits.get(episode.source)
            if limit is None or collected.failed_by_group.get(episode.group, 0) <= limit:
                kept.append(episode)
        return kept

    def metrics(self, episodes: list[Episode], prefix: str) -> dict[str, float]:
        """Totals, plus `<prefix>/<env>/...` per environment in multi-environment runs."""
        metrics = episode_metrics(episodes, prefix)
        if len(self.sources) > 1:
            for source in self.sources:
                mine = [e for e in episodes if e.source == source.name]
                metrics.update(episode_metrics(mine, f"{prefix}/{source.name}"))
        return metrics

    def example(self, episodes: list[Episode]) -> str | None:
        """The best episode's last turn in one line, so the log shows what the model does."""
        if not episodes:
            return None
        best = max(episodes, key=lambda e: e.total_reward)
        last = best.transitions[-1]
        prompt = self.renderer.decode(last.prompt_tokens)[-120:].replace("\n", " | ")
        response = self.renderer.decode(last.action_tokens)[:160].replace("\n", " | ")
        return (
            f"  best episode ({len(best.transitions)} turns, return {best.total_reward:.3f}): "
            f"...{prompt!r} -> {response!r}"
        )

    async def _collect(
        self, specs: Iterator[EpisodeSpec], policy: Policy, **options: object
    ) -> Collected:
        return await collect(
            specs,
            policy,
            self.renderer.prompt_tokens,
            self.renderer.decode,
            concurrency=self.concurrency,
            **options,  # type: ignore[arg-type]
        )


def concurrency_for(config: EnvConfig, backend: str) -> int:
    """Episodes in flight: the config's, or one per episode of a step on the local backend
    (it batches concurrent requests), 64 on Tinker."""
    if config.max_num_workers > 0:
        return config.max_num_workers
    per_step = config.batch_size * (config.group_size if config.advantage == "grpo" else 1)
    return min(64, max(1, per_step)) if backend == "local" else 64
