"""Rollouts as both sides know them (DESIGN §14): a step's episodes as plain typed records, which
of them a step keeps, and the JSON each is stored as. Runners build the records (our episodes,
Atropos sequences); the server reads them back; a Tinker session's samples fit the same shape.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

DEFAULT_PER_STEP = 256  # rollouts_per_step left unset: every episode of a step up to this
DEFAULT_MAX_MB = 64.0  # rollouts_max_mb left unset
MB = 1_000_000
# Kinds of record: our runs' episodes, Atropos' scored sequences, and (to come) what a Tinker
# session's sampling clients drew and the datums its forward_backward calls trained on.
Kind = Literal["episode", "sequence", "sample", "datum"]
Role = Literal["env", "model"]
Picked = Literal["all", "best", "worst", "random"]


@dataclass
class Segment:
    """A stretch of an episode's text: the environment's (an observation, a prompt) or the
    model's (its sampled tokens), with what that turn got."""

    role: Role
    text: str
    tokens: int = 0
    reward: float | None = None  # a model turn's reward, where the environment gives one
    advantage: float | None = None  # what the model's tokens were trained with


@dataclass
class RolloutRecord:
    """One episode of a step as a person reads it. `reward` is None where no reward is known
    (a Tinker session's samples), `advantage` None where it was not trained on."""

    kind: Kind
    group: int | None
    index: int  # its place among the step's episodes
    prompt: str
    completion: str
    reward: float | None
    advantage: float | None
    segments: list[Segment] = field(default_factory=list)
    finish_reason: str | None = None  # stop (a stop token), length (max tokens), or unknown
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprob_mean: float | None = None  # the sampler's, over the model's tokens
    metrics: dict[str, float] = field(default_factory=dict)  # the environment's
    turns: int = 1
    source: str = ""  # the environment, in a run that mixes several
    trained: bool = True  # in the step's training data (False: its group taught nothing)
    messages: list[dict[str, str]] | None = None  # the chat, where the environment sent one


def per_step(config: Mapping[str, Any]) -> int:
    """A run's rollouts_per_step (from its config's values), its default filled in."""
    value = config.get("rollouts_per_step")
    return DEFAULT_PER_STEP if value is None else int(value)


def max_mb(config: Mapping[str, Any]) -> float:
    value = config.get("rollouts_max_mb")
    return DEFAULT_MAX_MB if value is None else float(value)


def pick(records: list[RolloutRecord], limit: int, seed: int) -> list[tuple[RolloutRecord, Picked]]:
    """What a step keeps: every record up to `limit`; beyond it a quarter of `limit` best, a
    quarter worst (by reward; at least one each) and a random sample (seeded) of the rest, in
    the step's order."""
    if limit <= 0:
        return []
    if len(records) <= limit:
        return [(r, "all") for r in records]
    rewarded = sorted((r for r in records if r.reward is not None), key=_reward)
    ends = min(max(1, limit // 4) if limit >= 2 else 0, len(rewarded) // 2)
    chosen: dict[int, Picked] = {}
    for record in rewarded[:ends]:
        chosen[id(record)] = "worst"
    for record in rewarded[len(rewarded) - ends :]:
        chosen[id(record)] = "best"
    rest = [r for r in records if id(r) not in chosen]
    for record in random.Random(seed).sample(rest, limit - len(chosen)):
        chosen[id(record)] = "random"
    return [(r, chosen[id(r)]) for r in records if id(r) in chosen]


def _reward(record: RolloutRecord) -> float:
    return record.reward if record.reward is not None else 0.0


@dataclass(frozen=True)
class Rewards:
    """A step's rewards over every episode it had (kept or not)."""

    mean: float | None
    low: float | None
    high: float | None

    @classmethod
    def of(cls, records: list[RolloutRecord]) -> Rewards:
        values = [r.reward for r in records if r.reward is not None and math.isfinite(r.reward)]
        if not values:
            return cls(None, None, None)
        return cls(sum(values) / len(values), min(values), max(values))


def prompt_key(prompt: str) -> str:
    """The same prompt's key in every step (16 hex digits of its SHA-256)."""
    return hashlib.sha256(prompt.encode("utf-8", errors="replace")).hexdigest()[:16]


# What a record's body holds besides the columns a reader filters on.
BODY_FIELDS = (
    "prompt",
    "completion",
    "segments",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "logprob_mean",
    "metrics",
    "turns",
    "source",
    "trained",
    "messages",
)


def body_json(record: RolloutRecord) -> str:
    """The record's body as stored: JSON-safe (NaN and infinities as null)."""
    data = {name: getattr(record, name) for name in BODY_FIELDS}
    data["segments"] = [asdict(s) for s in record.segments]
    return json.dumps(_finite(data), ensure_ascii=False, separators=(",", ":"))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
