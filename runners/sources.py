"""The environments a run trains on: one, or several mixed by weight (multi-environment runs)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from environments._loader import load_env_class
from environments.base import BaseEnv, EnvConfig
from runners.rollouts import EpisodeSpec


@dataclass
class Source:
    name: str
    env_cls: type[BaseEnv]
    config: EnvConfig
    weight: float = 1.0

    @property
    def group_size(self) -> int:
        return self.config.group_size

    @property
    def max_failing(self) -> int | None:
        """Episodes a group may lose before it is dropped (OpenReward's max_failing_rollouts)."""
        return getattr(self.config, "max_failing_rollouts", None)

    def spec(self, group: int, seed: int) -> EpisodeSpec:
        return EpisodeSpec(group, seed, partial(self.env_cls, self.config), self.name)


def load_sources(frozen: dict[str, Any]) -> list[Source]:
    """From a run's frozen config: its `mix` when it has one, else its single environment."""
    mix = frozen.get("mix") or {
        frozen["environment"]: {
            "env_file": frozen["env_file"],
            "env_class": frozen["env_class"],
            "weight": 1.0,
            "config": frozen["config"],
        }
    }
    sources = []
    for name, item in mix.items():
        cls = load_env_class(Path(item["env_file"]), item["env_class"])
        sources.append(
            Source(name, cls, cls.Config.model_validate(item["config"]), float(item["weight"]))
        )
    return sources


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
