"""The losses a run may use and the `loss_fn_config` keys each accepts, with defaults and bounds.

One table for both sides: config validation at POST /runs (torch-free) and the local
backend's loss implementations read their defaults from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigKey:
    default: float
    low: float  # inclusive bounds
    high: float
    meaning: str


_CLIP_BOUNDS = (0.0, 100.0)

# The hosted service gives no default for DRO's beta; 0.05 is the value its examples use.
DRO_DEFAULT_BETA = 0.05
# stable_reinforce: weights truncated at 2 (as truncated importance sampling usually is);
# tokens whose ratio to the recorded sampler leaves [1/8, 8] are masked; a drift penalty to
# the sampler of DRO's form and default weight (benchmarks/stable_loss.py chose it).
STABLE_CLIP_HIGH = 2.0
STABLE_MASK_LOW = 0.125
STABLE_MASK_HIGH = 8.0
STABLE_KL_COEFF = 0.05

LOSS_CONFIG: dict[str, dict[str, ConfigKey]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {
        "clip_low_threshold": ConfigKey(0.8, *_CLIP_BOUNDS, "lower bound of the ratio"),
        "clip_high_threshold": ConfigKey(1.2, *_CLIP_BOUNDS, "upper bound of the ratio"),
    },
    "cispo": {
        "clip_low_threshold": ConfigKey(0.0, *_CLIP_BOUNDS, "lower bound of the ratio weight"),
        "clip_high_threshold": ConfigKey(4.0, *_CLIP_BOUNDS, "upper bound of the ratio weight"),
    },
    "dro": {"beta": ConfigKey(DRO_DEFAULT_BETA, 0.0, 100.0, "weight of the drift penalty")},
    # Tinker's GSPO page names PPO's keys; it gives no defaults of its own, so PPO's are kept.
    "gspo": {
        "clip_low_threshold": ConfigKey(0.8, *_CLIP_BOUNDS, "lower bound of the sequence ratio"),
        "clip_high_threshold": ConfigKey(1.2, *_CLIP_BOUNDS, "upper bound of the sequence ratio"),
    },
    # Ours (the hosted objective is not published): docs/tinker-api.md, "stable_reinforce".
    "stable_reinforce": {
        "clip_low_threshold": ConfigKey(0.0, *_CLIP_BOUNDS, "lower bound of the ratio weight"),
        "clip_high_threshold": ConfigKey(
            STABLE_CLIP_HIGH, *_CLIP_BOUNDS, "upper bound of the ratio weight (truncation)"
        ),
        "mask_low_threshold": ConfigKey(
            STABLE_MASK_LOW, 0.0, 1.0, "tokens whose ratio falls below it are masked"
        ),
        "mask_high_threshold": ConfigKey(
            STABLE_MASK_HIGH, 1.0, 1e6, "tokens whose ratio rises above it are masked"
        ),
        "kl_coeff": ConfigKey(
            STABLE_KL_COEFF, 0.0, 100.0, "weight of the drift penalty to the sampler"
        ),
    },
}

# What a training run may choose (cross_entropy is supervised, not an RL loss).
RL_LOSSES = ("importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce")
# Losses that read the sampler's logprobs from what it recorded, by the sampled sequences' ids:
# a run's driver must carry those ids on its sequences (ours do; a door's environments, which
# sample through the inference face as text or tokens, do not).
NEEDS_SEQUENCE_IDS = frozenset({"stable_reinforce"})


def defaults(loss_fn: str) -> dict[str, float]:
    return {key: spec.default for key, spec in LOSS_CONFIG[loss_fn].items()}


def resolve(loss_fn: str, config: Mapping[str, object] | None) -> dict[str, float]:
    """The loss's config with defaults filled in; ValueError naming the key otherwise."""
    if loss_fn not in LOSS_CONFIG:
        raise ValueError(f"unknown loss_fn {loss_fn!r}; known: {', '.join(sorted(LOSS_CONFIG))}")
    keys = LOSS_CONFIG[loss_fn]
    resolved = defaults(loss_fn)
    for key, value in (config or {}).items():
        if key not in keys:
            allowed = ", ".join(sorted(keys)) or "none (use {})"
            raise ValueError(
                f"unknown loss_fn_config key {key!r} for loss {loss_fn!r}; allowed keys: {allowed}"
            )
        number = _number(key, value)
        spec = keys[key]
        if not math.isfinite(number) or not spec.low <= number <= spec.high:
            raise ValueError(
                f"loss_fn_config[{key!r}] = {value!r} is outside [{spec.low:g}, {spec.high:g}] "
                f"({spec.meaning})"
            )
        resolved[key] = number
    low, high = resolved.get("clip_low_threshold"), resolved.get("clip_high_threshold")
    if low is not None and high is not None and low > high:
        raise ValueError(
            f"loss_fn_config: clip_low_threshold ({low:g}) must not exceed "
            f"clip_high_threshold ({high:g}) for loss {loss_fn!r}"
        )
    return resolved


def _number(key: str, value: object) -> float:
    """A config value as a float: a number, or a number written as text (the SDK sends string
    values as text in loss_fn_config_v2)."""
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"loss_fn_config[{key!r}] must be a number, got {value!r}")
