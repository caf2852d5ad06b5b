"""The environments a run trains on: one, or several mixed by weight (multi-environment runs)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from core.settings import Settings
from core.spec import EnvSource, RunSpec
from environments.base import BaseEnv, EnvConfig, EnvContext
from environments.support.loader import load_env_class
from runners.episodes.rollouts import EpisodeSpec


@dataclass
class Source:
    name: str
    env_cls: type[BaseEnv]
    config: EnvConfig
    context: EnvContext
    weight: float = 1.0

    @property
    def group_size(self) -> int:
        return self.config.group_size

    @property
    def max_failing(self) -> int | None:
        """Episodes a group may lose before it is dropped (OpenReward's max_failing_rollouts)."""
        return getattr(self.config, "max_failing_rollouts", None)

    def spec(self, group: int, seed: int) -> EpisodeSpec:
        return EpisodeSpec(group, seed, partial(self.env_cls, self.config, self.context), self.name)


def env_context(settings: Settings) -> EnvContext:
    """What environments get from this process: tokenizers resolved as the runner resolves
    models, and the one service key environments use (OpenReward's)."""
    from runners.models.loading import load_tokenizer

    key = settings.openreward_api_key
    return EnvContext(
        load_tokenizer=partial(load_tokenizer, models_dir=settings.models_dir),
        api_keys={"OPENREWARD_API_KEY": key.get_secret_value()} if key is not None else {},
    )


def load_source(name: str, source: EnvSource, context: EnvContext) -> Source:
    cls = load_env_class(Path(source.env_file), source.env_class)
    return Source(name, cls, cls.Config.model_validate(source.config), context, source.weight)


def load_sources(spec: RunSpec, context: EnvContext) -> list[Source]:
    """The run's environments, its own first (training settings come from its config)."""
    return [load_source(name, source, context) for name, source in spec.sources().items()]


class Mixer:
    """Smooth weighted round robin: over any window, each source gets groups in proportion to
    its weight, interleaved rather than in runs (deterministic, no sampling noise)."""

    def __init__(self, sources: list[Source]) -> None:
        self._sources = sources
        self._credit = [0.0] * len(sources)
        self._total = sum(s.weight for s in sources)

    def next(self) -> Source:
        for i, source in enumerate(self._sources):
            self._credit[i] += source.weight
        best = max(range(len(self._sources)), key=lambda i: self._credit[i])
        self._credit[best] -= self._total
        return self._sources[best]
