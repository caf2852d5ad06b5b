"""Tinker's built-in losses in torch: token level, SUM reduction, strict input and config checks.

Every loss is `-(per-token objective).sum()` over all positions of all datums in a call
(notes/tinker.md section 2); length or batch normalisation belongs in advantages or weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from core import loss_config

Tensor = torch.Tensor


@dataclass(frozen=True)
class LossSpec:
    """One loss: its loss_fn_inputs keys and its objective (config keys: core.loss_config)."""

    name: str
    inputs: tuple[str, ...]
    # objective(target_logprobs, inputs, config) -> per-token objective (to be maximised)
    objective: Callable[[Tensor, Mapping[str, Tensor], Mapping[str, float]], Tensor]


def _ratio(target_lp: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    return torch.exp(target_lp - inputs["logprobs"])


def _cross_entropy(lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]) -> Tensor:
    return inputs["weights"] * lp


def _importance_sampling(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]
) -> Tensor:
    return _ratio(lp, inputs) * inputs["advantages"]


def _ppo(lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]) -> Tensor:
    ratio = _ratio(lp, inputs)
    adv = inputs["advantages"]
    clipped = torch.clamp(ratio, cfg["clip_low_threshold"], cfg["clip_high_threshold"])
    return torch.minimum(ratio * adv, clipped * adv)


def _cispo(lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]) -> Tensor:
    # The clipped ratio is a constant weight (stop-gradient); the gradient flows through lp.
    weight = torch.clamp(
        _ratio(lp, inputs), cfg["clip_low_threshold"], cfg["clip_high_threshold"]
    ).detach()
    return weight * lp * inputs["advantages"]


def _dro(lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]) -> Tensor:
    # The drift penalty belongs to sampled tokens only. Prompt positions carry no sampler
    # logprob (0 by the datum convention) and no advantage; penalising them would pull the
    # prompt's logprobs towards 0, i.e. train on the prompt. A sampled token whose logprob is
    # exactly 0 had probability 1, so its drift is ~0 and masking it changes nothing.
    sampled = (inputs["logprobs"] != 0) | (inputs["advantages"] != 0)
    drift = (lp - inputs["logprobs"]) * sampled
    return lp * inputs["advantages"] - 0.5 * cfg["beta"] * drift * drift


_RL_INPUTS = ("target_tokens", "logprobs", "advantages")

LOSSES: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        LossSpec("cross_entropy", ("target_tokens", "weights"), _cross_entropy),
        LossSpec("importance_sampling", _RL_INPUTS, _importance_sampling),
        LossSpec("ppo", _RL_INPUTS, _ppo),
        LossSpec("cispo", _RL_INPUTS, _cispo),
        LossSpec("dro", _RL_INPUTS, _dro),
    )
}


def get_loss_spec(loss_fn: str) -> LossSpec:
    spec = LOSSES.get(loss_fn)
    if spec is None:
        allowed = ", ".join(sorted(LOSSES))
        raise ValueError(f"unknown loss_fn {loss_fn!r}; the local backend supports: {allowed}")
    return spec


def resolve_config(loss_fn: str, config: Mapping[str, object] | None) -> dict[str, float]:
    """The loss's config with defaults filled in; unknown keys and bad values are rejected."""
    get_loss_spec(loss_fn)
    return loss_config.resolve(loss_fn, config)


def check_input_keys(loss_fn: str, keys: Iterable[str], where: str = "loss_fn_inputs") -> None:
    """Reject unknown and missing loss_fn_inputs keys, as the hosted service does."""
    spec = get_loss_spec(loss_fn)
    present = set(keys)
    allowed = ", ".join(spec.inputs)
    for key in sorted(present - set(spec.inputs)):
        raise ValueError(
            f"{where}: unknown key {key!r} for loss {loss_fn!r}; allowed keys: {allowed}"
        )
    for key in spec.inputs:
        if key not in present:
            raise ValueError(
                f"{where}: missing required key {key!r} for loss {loss_fn!r}; "
                f"required keys: {allowed}"
            )


def compute_loss(
    loss_fn: str,
    target_logprobs: Tensor,
    inputs: Mapping[str, Tensor],
    config: Mapping[str, float],
) -> Tensor:
    """The summed loss (a scalar) for already-validated inputs aligned with target_logprobs."""
    spec = get_loss_spec(loss_fn)
    return -spec.objective(target_logprobs, inputs, config).sum()
