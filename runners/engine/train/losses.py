"""Tinker's built-in losses in torch: token level, SUM reduction, strict input and config checks.

Every loss is `-(per-token objective).sum()` over all positions of all datums in a call
(notes/tinker.md section 2); length or batch normalisation belongs in advantages or weights.
The objectives' equations are in docs/tinker-api.md ("Losses").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from core import loss_config

Tensor = torch.Tensor


# objective(target_logprobs, inputs, config, lengths) -> per-token objective (to be maximised);
# `lengths` splits the positions into datums, in order.
Objective = Callable[[Tensor, Mapping[str, Tensor], Mapping[str, float], Sequence[int]], Tensor]
# metrics(detached target_logprobs, inputs, config) -> sums to add to the call's metrics
Metrics = Callable[[Tensor, Mapping[str, Tensor], Mapping[str, float]], dict[str, Tensor]]

# Inputs the engine adds from recorded sequences (runners/engine/train/provenance.py), never sent.
RECORDED_LOGPROBS = "recorded_logprobs"  # the sampler's logprob of each sampled target
RECORDED_MASK = "recorded_mask"  # 1 where the target is a recorded sampled token


@dataclass(frozen=True)
class LossSpec:
    """One loss's implementation: its loss_fn_inputs keys and its objective; the rest of what
    is known of it (config keys, whether it reads recorded sequences) is its declaration in
    core.loss_config, under the same name."""

    name: str
    inputs: tuple[str, ...]  # required
    objective: Objective
    ignored: tuple[str, ...] = ()  # accepted (clients send them), not used
    # Accepted and read when sent; when not, filled from the datum's other inputs.
    optional: Mapping[str, Callable[[Mapping[str, Tensor]], Tensor]] = field(default_factory=dict)
    metrics: Metrics | None = None

    @property
    def reads_recorded(self) -> bool:
        """Its datums name recorded sequences (Datum.with_provenance), read into RECORDED_*."""
        return loss_config.LOSSES[self.name].reads_recorded


def _ratio(target_lp: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    return torch.exp(target_lp - inputs["logprobs"])


def _cross_entropy(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float], lengths: Sequence[int]
) -> Tensor:
    return inputs["weights"] * lp


def _importance_sampling(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float], lengths: Sequence[int]
) -> Tensor:
    """r_t A_t, Tinker's objective; with a rollout correction (verl's names, off by default),
    each token's ratio truncated at rollout_is_threshold C (the objective's value min(r_t, C)
    A_t, its gradient min(r_t, C) A_t d lp_t) and tokens whose ratio leaves
    [rollout_rs_threshold_lower, rollout_rs_threshold] masked out."""
    ratio = _ratio(lp, inputs)
    cap = cfg.get("rollout_is_threshold", 0.0)
    if cap > 0:
        # Past the cap the weight is a constant C, the gradient still through lp.
        ratio = torch.where(ratio.detach() <= cap, ratio, cap * torch.exp(lp - lp.detach()))
    return _rollout_kept(ratio.detach(), cfg) * ratio * inputs["advantages"]


def _rollout_kept(ratio: Tensor, cfg: Mapping[str, float]) -> Tensor:
    """1 where a token's ratio lies in the rollout mask's band (or no band is set), else 0."""
    low, high = cfg.get("rollout_rs_threshold_lower", 0.0), cfg.get("rollout_rs_threshold", 0.0)
    kept = torch.ones_like(ratio, dtype=torch.bool)
    if low > 0:
        kept &= ratio >= low
    if high > 0:
        kept &= ratio <= high
    return kept.to(ratio.dtype)


def _ppo(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float], lengths: Sequence[int]
) -> Tensor:
    ratio = _ratio(lp, inputs)
    adv = inputs["advantages"]
    clipped = torch.clamp(ratio, cfg["clip_low_threshold"], cfg["clip_high_threshold"])
    return torch.minimum(ratio * adv, clipped * adv)


def _cispo(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float], lengths: Sequence[int]
) -> Tensor:
    # The clipped ratio is a constant weight (stop-gradient); the gradient flows through lp.
    weight = torch.clamp(
        _ratio(lp, inputs), cfg["clip_low_threshold"], cfg["clip_high_threshold"]
    ).detach()
    return weight * lp * inputs["advantages"]


def _dro(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float], lengths: Sequence[int]
) -> Tensor:
    # The drift penalty belongs to sampled tokens only. Prompt positions carry no sampler
    # logprob (0 by the datum convention) and no advantage; penalising them would pull the
    # prompt's logprobs towards 0, i.e. train on the prompt. A sampled token whose logprob is
    # exactly 0 had probability 1, so its drift is ~0 and masking it changes nothing.
    sampled = (inputs["logprobs"] != 0) | (inputs["advantages"] != 0)
    drift = (lp - inputs["logprobs"]) * sampled
    return lp * inputs["advantages"] - 0.5 * cfg["beta"] * drift * drift


def _per_datum_mean(values: Tensor, counted: Tensor, lengths: Sequence[int]) -> Tensor:
    """Each position gets the mean of `values` over its datum's `counted` positions (0 for a
    datum with none)."""
    datum = torch.repeat_interleave(
        torch.arange(len(lengths), device=values.device),
        torch.tensor(list(lengths), device=values.device),
    )
    zeros = torch.zeros(len(lengths), device=values.device, dtype=values.dtype)
    sums = zeros.index_add(0, datum, values * counted)
    counts = zeros.index_add(0, datum, counted)
    return (sums / counts.clamp(min=1))[datum]


def _gspo(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float], lengths: Sequence[int]
) -> Tensor:
    """GSPO-token, as Tinker documents it. Per datum, the sequence log-ratio is the mean of
    sg(lp) - q over the positions `sequence_ratio_mask` marks (nonzero); every position's
    ratio takes that value with its own logprob's gradient, s_t = sg(s) * exp(lp - sg(lp));
    then PPO's min(s_t A, clip(s_t, low, high) A). A datum that marks no position has s = 1."""
    counted = (inputs["sequence_ratio_mask"] != 0).to(lp.dtype)
    sequence_log_ratio = _per_datum_mean(lp.detach() - inputs["logprobs"], counted, lengths)
    ratio = torch.exp(sequence_log_ratio + lp - lp.detach())
    adv = inputs["advantages"]
    clipped = torch.clamp(ratio, cfg["clip_low_threshold"], cfg["clip_high_threshold"])
    return torch.minimum(ratio * adv, clipped * adv)


def _kept_tokens(
    log_ratio: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]
) -> Tensor:
    """1 on recorded sampled tokens whose ratio lies in [mask_low, mask_high], else 0."""
    low, high = cfg["mask_low_threshold"], cfg["mask_high_threshold"]
    log_low = math.log(low) if low > 0 else -math.inf
    in_band = (log_ratio >= log_low) & (log_ratio <= math.log(high))
    return (inputs[RECORDED_MASK] != 0) & in_band


def _stable_reinforce(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float], lengths: Sequence[int]
) -> Tensor:
    """REINFORCE with truncated importance weights against the recorded sampler logprobs q
    (never the client's copies), tokens far off the sampler masked (docs/tinker-api.md):

        r_t = exp(sg(lp_t) - q_t)
        m_t = 1 if t is a recorded sampled token and mask_low <= r_t <= mask_high, else 0
        w_t = clip(r_t, clip_low, clip_high)                       (a constant weight)
        objective_t = m_t * (w_t * A_t * lp_t - kl_coeff / 2 * (lp_t - q_t)^2)

    The gradient is m_t (w_t A_t - kl_coeff (lp_t - q_t)) d lp_t: bounded by clip_high and by
    the band, however stale the sampler."""
    q = inputs[RECORDED_LOGPROBS]
    log_ratio = lp.detach() - q
    kept = _kept_tokens(log_ratio, inputs, cfg).to(lp.dtype)
    # exp may overflow to inf on a masked token: clamp first, then the mask zeroes it.
    weight = torch.clamp(
        torch.exp(log_ratio), cfg["clip_low_threshold"], cfg["clip_high_threshold"]
    )
    drift = (lp - q) * kept
    return kept * weight * inputs["advantages"] * lp - 0.5 * cfg["kl_coeff"] * drift * drift


def _stable_reinforce_metrics(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]
) -> dict[str, Tensor]:
    log_ratio = lp - inputs[RECORDED_LOGPROBS]
    sampled = inputs[RECORDED_MASK] != 0
    kept = _kept_tokens(log_ratio, inputs, cfg)
    ratio = torch.exp(log_ratio)
    truncated = kept & ((ratio < cfg["clip_low_threshold"]) | (ratio > cfg["clip_high_threshold"]))
    masked = sampled & ~kept
    return {
        "sampled_tokens:sum": sampled.sum(),
        "masked_tokens:sum": masked.sum(),
        "truncated_tokens:sum": truncated.sum(),
        "corrected_tokens:sum": (masked | truncated).sum(),
        **mismatch_metrics(log_ratio, sampled),
    }


def _sampled(inputs: Mapping[str, Tensor]) -> Tensor:
    """The positions the sampler drew, by the datums' convention: a logprob or an advantage
    (prompt positions carry neither)."""
    return (inputs["logprobs"] != 0) | (inputs["advantages"] != 0)


def mismatch_metrics(log_ratio: Tensor, sampled: Tensor) -> dict[str, Tensor]:
    """How far the trainer is from the sampler on the sampled tokens (log_ratio: trainer minus
    sampler logprob), as sums and a max so that chunks merge (the SDK merges by the suffix):
    the count, k3 (r - 1 - log r, an estimate of KL(sampler || trainer)), the largest
    |difference| and how many ratios lie outside [0.5, 2]."""
    d = log_ratio[sampled]
    if d.numel() == 0:
        zero = torch.zeros((), device=log_ratio.device)
        return {"mismatch_tokens:sum": zero}
    ratio = torch.exp(d)
    return {
        "mismatch_tokens:sum": torch.tensor(float(d.numel()), device=d.device),
        "mismatch_k3:sum": (ratio - 1 - d).sum(),
        "mismatch_logprob_diff:max": d.abs().max(),
        "mismatch_ratio_outside:sum": ((ratio < 0.5) | (ratio > 2.0)).sum(),
    }


def _rl_metrics(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]
) -> dict[str, Tensor]:
    return mismatch_metrics(lp - inputs["logprobs"], _sampled(inputs))


def _importance_sampling_metrics(
    lp: Tensor, inputs: Mapping[str, Tensor], cfg: Mapping[str, float]
) -> dict[str, Tensor]:
    """The mismatch, and what the rollout correction touched: tokens truncated (their ratio
    above rollout_is_threshold) or masked (outside the band)."""
    sampled = _sampled(inputs)
    ratio = _ratio(lp, inputs)
    cap = cfg.get("rollout_is_threshold", 0.0)
    masked = sampled & (_rollout_kept(ratio, cfg) == 0)
    truncated = sampled & ~masked & (ratio > cap) if cap > 0 else torch.zeros_like(sampled)
    return {
        **_rl_metrics(lp, inputs, cfg),
        "is_truncated:sum": truncated.sum(),
        "is_masked:sum": masked.sum(),
        "corrected_tokens:sum": (truncated | masked).sum(),
    }


_RL_INPUTS = ("target_tokens", "logprobs", "advantages")

# Every loss declared in core.loss_config.LOSSES, and no other (tests/backend/test_losses.py).
LOSSES: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        LossSpec("cross_entropy", ("target_tokens", "weights"), _cross_entropy),
        LossSpec(
            "importance_sampling",
            _RL_INPUTS,
            _importance_sampling,
            metrics=_importance_sampling_metrics,
        ),
        LossSpec("ppo", _RL_INPUTS, _ppo, metrics=_rl_metrics),
        LossSpec("cispo", _RL_INPUTS, _cispo, metrics=_rl_metrics),
        LossSpec("dro", _RL_INPUTS, _dro, metrics=_rl_metrics),
        # tinker-cookbook's RL trainer (rl/train.py) sends no sequence_ratio_mask: the ratio is
        # then taken over the tokens the datum trains (a nonzero advantage; prompts carry 0).
        LossSpec(
            "gspo",
            _RL_INPUTS,
            _gspo,
            optional={"sequence_ratio_mask": lambda inputs: (inputs["advantages"] != 0).float()},
            metrics=_rl_metrics,
        ),
        # The client's `logprobs` (the cookbook sends them) are accepted and not used: the
        # sampler's come from the recorded sequences the datum's spans name.
        LossSpec(
            "stable_reinforce",
            ("target_tokens", "advantages"),
            _stable_reinforce,
            ignored=("logprobs",),
            metrics=_stable_reinforce_metrics,
        ),
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
    allowed = ", ".join((*spec.inputs, *spec.optional, *spec.ignored))
    for key in sorted(present - set(spec.inputs) - set(spec.optional) - set(spec.ignored)):
        raise ValueError(
            f"{where}: unknown key {key!r} for loss {loss_fn!r}; allowed keys: {allowed}"
        )
    for key in spec.inputs:
        if key not in present:
            raise ValueError(
                f"{where}: missing required key {key!r} for loss {loss_fn!r}; "
                f"required keys: {', '.join(spec.inputs)}"
            )


def compute_loss(
    loss_fn: str,
    target_logprobs: Tensor,
    inputs: Mapping[str, Tensor],
    config: Mapping[str, float],
    lengths: Sequence[int] | None = None,
) -> Tensor:
    """The summed loss (a scalar) for already-validated inputs aligned with target_logprobs;
    `lengths` splits the positions into datums (one datum when None)."""
    spec = get_loss_spec(loss_fn)
    split = [len(target_logprobs)] if lengths is None else lengths
    return -spec.objective(target_logprobs, inputs, config, split).sum()


def loss_metrics(
    loss_fn: str, target_logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]
) -> dict[str, Tensor]:
    """The loss's own metrics besides loss:sum (sums over the positions given), if any."""
    spec = get_loss_spec(loss_fn)
    if spec.metrics is None:
        return {}
    return spec.metrics(target_logprobs.detach(), inputs, config)
