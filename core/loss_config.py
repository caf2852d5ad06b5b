"""The losses, declared once: each one's name, its `loss_fn_config` keys (defaults, bounds) and
what it asks of a run. Config validation at POST /runs (torch-free) and the local backend's
implementations (runners/engine/train/losses.py) both read this table.

Adding a loss: its `Loss` in `LOSSES` here; its `LossSpec` (inputs, torch objective) of the
same name in runners/engine/train/losses.py (a test checks that both tables name the same
losses); its row in docs/tinker-api.md's "Losses". A run's datums carry the RL inputs
(runners/train/learner.py `datum`); a loss with required inputs beyond them needs its case there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ConfigKey:
    default: float
    low: float  # inclusive bounds
    high: float
    meaning: str


@dataclass(frozen=True)
class Loss:
    """One loss as both sides know it (its torch code: runners/engine/train/losses.py)."""

    name: str
    config: Mapping[str, ConfigKey] = field(default_factory=dict)  # its loss_fn_config keys
    # A training run may choose it; cross_entropy is supervised (Tinker API scripts only).
    rl: bool = True
    # It reads the sampler's logprobs from what the sampler recorded, by the sampled sequences'
    # ids: a run's driver must carry those ids on its sequences (ours do; a door's environments,
    # which sample through the inference face as text or tokens, do not).
    reads_recorded: bool = False


_CLIP_BOUNDS = (0.0, 100.0)


def _clip(low: float, high: float, clipped: str) -> dict[str, ConfigKey]:
    """The two keys of a clip band (PPO's names), with their defaults, bounding `clipped`."""
    return {
        "clip_low_threshold": ConfigKey(low, *_CLIP_BOUNDS, f"lower bound of the {clipped}"),
        "clip_high_threshold": ConfigKey(high, *_CLIP_BOUNDS, f"upper bound of the {clipped}"),
    }


# The hosted service gives no default for DRO's beta; 0.05 is the value its examples use.
DRO_DEFAULT_BETA = 0.05
# stable_reinforce: weights truncated at 2 (as truncated importance sampling usually is);
# tokens whose ratio to the recorded sampler leaves [1/8, 8] are masked; a drift penalty to
# the sampler of DRO's form and default weight (benchmarks/stable_loss.py chose it).
STABLE_CLIP_HIGH = 2.0
STABLE_MASK_LOW = 0.125
STABLE_MASK_HIGH = 8.0
STABLE_KL_COEFF = 0.05
# importance_sampling's rollout correction (verl's names): off unless asked (Tinker's exact
# objective); native runs on the local engine ask for token TIS at 2 with tokens outside
# [1/8, 8] masked (core/training_config.py `rollout_correction`).
ROLLOUT_IS_THRESHOLD = 2.0
ROLLOUT_RS_THRESHOLD_LOWER = 0.125
ROLLOUT_RS_THRESHOLD = 8.0
ROLLOUT_CORRECTION = {
    "rollout_is_threshold": ROLLOUT_IS_THRESHOLD,
    "rollout_rs_threshold_lower": ROLLOUT_RS_THRESHOLD_LOWER,
    "rollout_rs_threshold": ROLLOUT_RS_THRESHOLD,
}

# In the order a run's config offers them (its JSON schema's enum).
LOSSES: dict[str, Loss] = {
    loss.name: loss
    for loss in (
        Loss("cross_entropy", rl=False),
        Loss(
            "importance_sampling",
            {
                "rollout_is_threshold": ConfigKey(
                    0.0, 0.0, 1e6, "each token's ratio truncated at it (token TIS); 0: none"
                ),
                "rollout_rs_threshold_lower": ConfigKey(
                    0.0, 0.0, 1.0, "tokens whose ratio falls below it are masked; 0: none"
                ),
                "rollout_rs_threshold": ConfigKey(
                    0.0, 0.0, 1e6, "tokens whose ratio rises above it are masked; 0: none"
                ),
            },
        ),
        Loss("ppo", _clip(0.8, 1.2, "ratio")),
        Loss("cispo", _clip(0.0, 4.0, "ratio weight")),
        Loss(
            "dro", {"beta": ConfigKey(DRO_DEFAULT_BETA, 0.0, 100.0, "weight of the drift penalty")}
        ),
        # Tinker's GSPO page names PPO's keys; it gives no defaults of its own, so PPO's are kept.
        Loss("gspo", _clip(0.8, 1.2, "sequence ratio")),
        # Ours (the hosted objective is not published): docs/tinker-api.md, "stable_reinforce".
        Loss(
            "stable_reinforce",
            {
                **_clip(0.0, STABLE_CLIP_HIGH, "ratio weight"),
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
            reads_recorded=True,
        ),
    )
}

# What a training run may choose.
RL_LOSSES = tuple(name for name, loss in LOSSES.items() if loss.rl)


def usable_losses(sequence_ids: bool) -> tuple[str, ...]:
    """What a run may choose, where its driver carries the sampled sequences' ids or not (a
    door's environments sample through the inference face: they cannot feed a loss that
    `reads_recorded`)."""
    return tuple(name for name in RL_LOSSES if sequence_ids or not LOSSES[name].reads_recorded)


def with_rollout_correction(
    loss_fn: str, config: Mapping[str, float], correction: str | None, backend: str
) -> dict[str, float]:
    """A run's loss_fn_config with its rollout correction (`rollout_correction`: token unless
    none) filled in where the run's config sets no threshold of its own: for
    importance_sampling on the local engine only (hosted Tinker takes no such keys)."""
    if loss_fn != "importance_sampling" or backend != "local" or correction == "none":
        return dict(config)
    return {**ROLLOUT_CORRECTION, **config}


def defaults(loss_fn: str) -> dict[str, float]:
    return {key: spec.default for key, spec in LOSSES[loss_fn].config.items()}


def resolve(loss_fn: str, config: Mapping[str, object] | None) -> dict[str, float]:
    """The loss's config with defaults filled in; ValueError naming the key otherwise."""
    if loss_fn not in LOSSES:
        raise ValueError(f"unknown loss_fn {loss_fn!r}; known: {', '.join(sorted(LOSSES))}")
    keys = LOSSES[loss_fn].config
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
