"""The learner, written once (DESIGN §7): what every driver hands it and what it does with it.

    native loop (runners/train/loop.py): Episodes, one Sequence per turn  ─┐
    Atropos trainer (runners/atropos/): ScoredDataGroups, one per sequence ─┴─> [Sequence]
        tokens, trained mask, sampler logprobs, reward, group, sample (, own advantages)
    -> assign_advantages: grpo (group-relative) | rebn (batch-normalised returns) | own
    -> fold_* (optional): x reward_coef, a KL penalty to a reference, a teacher's reverse KL
    -> datum per sequence (tinker's shape; gspo's mask, stable_reinforce's provenance)
    -> train_on: forward_backward + optim_step -> train/* metrics and the sampler/learner KL

Drivers keep what is theirs: sampling or reading a batch, their data's metrics; the step body
around the learner is one, RunnerBase.train_step (runners/train/run_base.py).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from tinker import types

from core import loss_config
from runners.episodes.policy import bounded

if TYPE_CHECKING:
    from collections.abc import Mapping

    from runners.backends.surface import TrainingClient

AdvantageMode = Literal["grpo", "rebn"]
# A native turn's place in its step, (sample, turn) under this meta key: how its rollout record
# finds the advantage it was trained with.
TURN = "turn"
# The sampler's id for the sequence's sampled (trained) tokens: stable_reinforce's provenance.
SEQUENCE_ID = "sequence_id"


@dataclass
class Sequence:
    """One datum's worth: a prompt and what the policy sampled after it, as one token list."""

    tokens: list[int]
    trained: list[bool]  # per token: the policy's own output, in the loss
    # Per token, the sampler's (any value where not trained); None: not sent, and the driver
    # recomputes them before training.
    logprobs: list[float] | None
    reward: float  # this turn's reward; a sample's return is the sum over its turns
    group: int  # GRPO compares the samples of one group
    sample: int  # which sample of the batch: the turns of one episode share it
    # Per token, zero where not trained: set by `assign_advantages`, or given by the
    # environment beforehand (they then pass through).
    advantages: list[float] | None = None
    # What a driver or a later stage carries along with it: the policy step it was sampled
    # at (for a staleness bound), what a rollout viewer shows of it, ...
    meta: dict[str, Any] = field(default_factory=dict)

    def mean_advantage(self) -> float | None:
        """The advantage over its trained tokens (None before advantages are set)."""
        if self.advantages is None:
            return None
        values = [a for a, t in zip(self.advantages, self.trained, strict=True) if t]
        return sum(values) / len(values) if values else None


@dataclass
class Advantaged:
    sequences: list[Sequence]  # those to train on, advantages set, in training order
    dropped_groups: int  # groups left out: every return in them equal, no signal


# Advantages ------------------------------------------------------------------------------


def assign_advantages(
    sequences: list[Sequence],
    mode: AdvantageMode,
    *,
    scale_by_std: bool = False,
    gamma: float = 1.0,
    limit: int | None = None,
    seed: int = 0,
    keep_flat: bool = False,
) -> Advantaged:
    """Each sequence's per-token advantages (DESIGN §7), set in place; sequences that came
    with their own keep them, masked to their trained tokens.

    `grpo`: a sample's return minus its group's mean (over its std with `scale_by_std`);
    groups whose returns are all equal teach nothing and are dropped. `rebn`: per-turn
    discounted returns (`gamma`) z-scored across the batch, as the GEM reference trainer
    does; with more than `limit` sequences a random subset of `limit` (`seed`) is kept.
    `keep_flat`: what has no signal of its own is kept with advantage 0 instead (a teacher's
    per-token signal still teaches it).
    """
    for sequence in sequences:
        if sequence.advantages is not None:
            sequence.advantages = _on_trained(sequence, sequence.advantages)
    todo = [s for s in sequences if s.advantages is None]
    if mode == "rebn":
        dropped = _rebn(todo, gamma)
        if keep_flat:
            dropped = _zero_unset(todo)
        kept = [s for s in sequences if s.advantages is not None]
        if limit is not None and len(kept) > limit:
            kept = random.Random(seed).sample(kept, limit)
        return Advantaged(kept, dropped)
    dropped = sum(_grpo(members, scale_by_std) for members in _grouped(todo, "group"))
    if keep_flat:
        dropped = _zero_unset(todo)
    by_group = [s for members in _grouped(sequences, "group") for s in members]
    return Advantaged([s for s in by_group if s.advantages is not None], dropped)


def _grpo(members: list[Sequence], scale_by_std: bool) -> int:
    """One group's advantages; 1 when it is dropped, else 0."""
    samples = _grouped(members, "sample")
    values = group_relative([sum(s.reward for s in turns) for turns in samples], scale_by_std)
    if values is None:
        return 1
    for turns, value in zip(samples, values, strict=True):
        for sequence in turns:
            sequence.advantages = _on_trained(sequence, value)
    return 0


def _rebn(sequences: list[Sequence], gamma: float) -> int:
    """The batch's advantages; every group counts as dropped when there is no signal."""
    samples = _grouped(sequences, "sample")
    returns = [r for turns in samples for r in discounted_returns([s.reward for s in turns], gamma)]
    values = batch_normalised(returns)
    if values is None:
        return len({s.group for s in sequences})
    ordered = [s for turns in samples for s in turns]
    for sequence, value in zip(ordered, values, strict=True):
        sequence.advantages = _on_trained(sequence, value)
    return 0


def _zero_unset(sequences: list[Sequence]) -> int:
    """Advantage 0 for those that got none (kept, not dropped): 0 groups dropped."""
    for sequence in sequences:
        if sequence.advantages is None:
            sequence.advantages = _on_trained(sequence, 0.0)
    return 0


def group_relative(returns: list[float], scale_by_std: bool) -> list[float] | None:
    """Each return minus the group's mean (optionally over the group's std); None when the
    group has fewer than two samples or all-equal returns."""
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
    if len(returns) < 2 or std < 1e-8:
        return None
    return [(r - mean) / (std + 1e-6) if scale_by_std else r - mean for r in returns]


def batch_normalised(values: list[float]) -> list[float] | None:
    """z-scores with the sample standard deviation (as torch.std computes it in the GEM
    reference); None with fewer than two values or all-equal ones."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    if std < 1e-8:
        return None
    return [(v - mean) / (std + 1e-9) for v in values]


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    out = [0.0] * len(rewards)
    running = 0.0
    for i in reversed(range(len(rewards))):
        running = rewards[i] + gamma * running
        out[i] = running
    return out


def _grouped(sequences: list[Sequence], key: Literal["group", "sample"]) -> list[list[Sequence]]:
    """The sequences by `key`, in order of first appearance."""
    groups: dict[int, list[Sequence]] = {}
    for sequence in sequences:
        groups.setdefault(getattr(sequence, key), []).append(sequence)
    return list(groups.values())


def _on_trained(sequence: Sequence, value: float | list[float]) -> list[float]:
    """Per token: `value` (one for all, or one each) where trained, zero elsewhere."""
    values = [value] * len(sequence.tokens) if isinstance(value, float | int) else value
    return [float(a) if t else 0.0 for a, t in zip(values, sequence.trained, strict=True)]


# Other signals, folded into the advantages -----------------------------------------------


def scale_advantages(sequences: list[Sequence], coef: float) -> None:
    """The environment reward's share (`reward_coef`) of what is folded in next."""
    for sequence in sequences:
        assert sequence.advantages is not None
        sequence.advantages = [a * coef for a in sequence.advantages]


def fold_kl_penalty(
    sequences: list[Sequence], reference: list[list[float]], coef: float
) -> float | None:
    """tinker-cookbook's `incorporate_kl_penalty`: per trained token, d_t = log p_sampler -
    log p_reference, and the advantage gains coef * (mean d - d_t), the mean over every
    trained token of the batch. Returns the mean d (the KL estimate; None without tokens)."""
    diffs = _diffs(sequences, reference)
    mean = _mean(diffs)
    if mean is None:
        return None
    for sequence, diff in zip(sequences, diffs, strict=True):
        _add(sequence, [coef * (mean - d) if d is not None else 0.0 for d in diff])
    return mean


def fold_teacher(
    sequences: list[Sequence], teacher: list[list[float]], coef: float
) -> float | None:
    """On-policy distillation (tinker-cookbook's distillation/train_on_policy.py): per trained
    token the reverse KL r_t = log p_sampler - log p_teacher, and the advantage gains
    -coef * r_t. Returns the mean r (None without trained tokens)."""
    diffs = _diffs(sequences, teacher)
    for sequence, diff in zip(sequences, diffs, strict=True):
        _add(sequence, [-coef * d if d is not None else 0.0 for d in diff])
    return _mean(diffs)


def _diffs(sequences: list[Sequence], other: list[list[float]]) -> list[list[float | None]]:
    """Per token, the sampler's logprob minus `other`'s where it is a trained target (never
    the first token: nothing predicts it), else None."""
    out = []
    for sequence, theirs in zip(sequences, other, strict=True):
        assert sequence.logprobs is not None
        targets = [False, *sequence.trained[1:]]
        out.append(
            [
                mine - their if target else None
                for mine, their, target in zip(sequence.logprobs, theirs, targets, strict=True)
            ]
        )
    return out


def _mean(diffs: list[list[float | None]]) -> float | None:
    values = [d for diff in diffs for d in diff if d is not None]
    return sum(values) / len(values) if values else None


def _add(sequence: Sequence, values: list[float]) -> None:
    assert sequence.advantages is not None, "advantages are assigned before signals are folded"
    sequence.advantages = [a + v for a, v in zip(sequence.advantages, values, strict=True)]


# Training --------------------------------------------------------------------------------


def datum(sequence: Sequence, loss_fn: str = "importance_sampling") -> types.Datum | None:
    """Input = tokens[:-1], target = tokens[1:]; the sampler's logprobs and the advantages sit
    on the trained targets only. None when no target is trained. `gspo` also gets its
    sequence_ratio_mask (the trained targets), `stable_reinforce` the provenance spans naming
    the sampled sequence (SEQUENCE_ID in meta), as tinker-cookbook builds them."""
    targets = sequence.trained[1:]
    if not any(targets):
        return None
    assert sequence.logprobs is not None, "logprobs are filled in before datums are made"
    assert sequence.advantages is not None, "advantages are assigned before datums are made"
    sampled = [lp if t else 0.0 for lp, t in zip(sequence.logprobs[1:], targets, strict=True)]
    # As Datum would convert plain lists (int64 targets, float32 values), done here so the
    # values have the type its field declares.
    inputs = {
        "target_tokens": _tensor(sequence.tokens[1:], np.int64),
        "logprobs": _tensor(sampled, np.float32),
        "advantages": _tensor(sequence.advantages[1:], np.float32),
    }
    if loss_fn == "gspo":
        inputs["sequence_ratio_mask"] = _tensor([float(t) for t in targets], np.float32)
    made = types.Datum(
        model_input=types.ModelInput.from_ints(sequence.tokens[:-1]), loss_fn_inputs=inputs
    )
    return with_provenance(made, sequence) if loss_config.LOSSES[loss_fn].reads_recorded else made


def with_provenance(made: types.Datum, sequence: Sequence) -> types.Datum:
    """The datum's spans: its prompt (the untrained head) and its sampled tokens (the trained
    tail) are those of the sampled sequence the sampler recorded under SEQUENCE_ID."""
    sequence_id = sequence.meta.get(SEQUENCE_ID)
    prompt = sequence.trained.index(True)
    sampled = len(sequence.tokens) - prompt
    if sequence_id is None or sequence.trained != [False] * prompt + [True] * sampled:
        raise ValueError(
            "stable_reinforce trains sequences the sampler recorded: each needs its sampled "
            "sequence's id and one run of sampled tokens after its prompt"
        )

    def spans(
        prompt_from: int, prompt_length: int, sampled_length: int
    ) -> list[types.PromptProvenanceSpan | types.SampledProvenanceSpan]:
        out: list[types.PromptProvenanceSpan | types.SampledProvenanceSpan] = []
        if prompt_length:
            out.append(
                types.PromptProvenanceSpan(
                    sequence_id=sequence_id, offset=prompt_from, length=prompt_length
                )
            )
        if sampled_length:
            out.append(types.SampledProvenanceSpan(sequence_id=sequence_id, length=sampled_length))
        return out

    # Inputs are tokens[:-1] (the prompt, then the sampled tokens but the last); targets are
    # tokens[1:] (the prompt from its second token, then every sampled token).
    return made.with_provenance(
        model_input=spans(0, prompt, sampled - 1),
        loss_fn_inputs=spans(1, prompt - 1, sampled),
    )


def _tensor(values: list[int] | list[float], dtype: type[np.generic]) -> types.TensorData:
    return types.TensorData.from_numpy(np.asarray(values, dtype=dtype))


async def train_on(
    training: TrainingClient,
    sequences: list[Sequence],
    loss_fn: str,
    loss_fn_config: Mapping[str, float],
    adam: types.AdamParams,
    *,
    timeout_s: float | None = None,
) -> dict[str, float]:
    """One optimizer step on `sequences`: forward_backward and optim_step submitted back to
    back (the backend pipelines them), then awaited; the step's train/* metrics and KL."""
    kept: list[Sequence] = []
    datums: list[types.Datum] = []
    for sequence in sequences:
        made = datum(sequence, loss_fn)
        if made is not None:
            kept.append(sequence)
            datums.append(made)
    if not datums:
        return {}
    fwd_bwd = training.forward_backward(datums, loss_fn, dict(loss_fn_config))
    optim = training.optim_step(adam)
    result = await bounded(fwd_bwd, timeout_s, "forward_backward")
    stepped = await bounded(optim, timeout_s, "optim_step")
    return _step_metrics(kept, result, stepped)


def _step_metrics(
    kept: list[Sequence], result: types.ForwardBackwardOutput, stepped: types.OptimStepResponse
) -> dict[str, float]:
    """The step's train/* metrics from forward_backward's `result` and optim_step's `stepped`
    answers, with the sampler/learner KL on the `kept` sequences (those made datums)."""
    # fp16 training's loss scale and the steps it skipped on an overflow (local engine, CUDA).
    scaling = {
        f"train/{key}": float(value)
        for key, value in (getattr(stepped, "metrics", None) or {}).items()
        if key in ("loss_scale", "skipped_steps")
    }
    tokens = sum(sum(s.trained[1:]) for s in kept)
    loss_sum = float(result.metrics.get("loss:sum", 0.0))
    # The loss's own counts (stable_reinforce's masked and truncated tokens, importance
    # sampling's rollout correction's); the mismatch's are shown as mismatch/*, below.
    own = {
        f"train/{key.removesuffix(':sum')}": float(value)
        for key, value in result.metrics.items()
        if key.endswith(":sum") and key != "loss:sum" and not key.startswith(MISMATCH_KEYS)
    }
    return {
        "train/loss": loss_sum / max(1, tokens),
        "train/loss_sum": loss_sum,
        "train/num_datums": float(len(kept)),
        "train/num_action_tokens": float(tokens),
        **own,
        **scaling,
        **kl_metrics(kept, result.loss_fn_outputs),
        **corrected_share(result.metrics),
    }


# The loss's metrics this module reports as shares of the sampled tokens instead.
MISMATCH_KEYS = ("mismatch_", "corrected_tokens")


def kl_metrics(sequences: list[Sequence], outputs: list[dict[str, Any]]) -> dict[str, float]:
    """Sampler vs learner logprobs on the trained targets: the reference script's KL estimates
    and the sampler's entropy estimate, and the mismatch as prime-rl and TRL show it (k3, the
    largest and mean |difference|, the share of ratios outside [0.5, 2])."""
    diffs: list[float] = []  # sampler minus learner, as the cookbook's v1 takes it
    sampled: list[float] = []
    for sequence, output in zip(sequences, outputs, strict=True):
        assert sequence.logprobs is not None
        learner = output["logprobs"].tolist()
        for q, p, t in zip(sequence.logprobs[1:], learner, sequence.trained[1:], strict=False):
            if t:
                diffs.append(q - p)
                sampled.append(q)
    if not diffs:
        return {}
    ratios = [math.exp(-d) for d in diffs]  # learner over sampler
    n = len(diffs)
    return {
        "train/kl_sample_train_v1": sum(diffs) / n,
        "train/kl_sample_train_v2": 0.5 * sum(d * d for d in diffs) / n,
        "sampler/token_entropy": -sum(sampled) / len(sampled),
        "mismatch/k3": sum(r - 1 + d for r, d in zip(ratios, diffs, strict=True)) / n,
        "mismatch/abs_max": max(abs(d) for d in diffs),
        "mismatch/abs_mean": sum(abs(d) for d in diffs) / n,
        "mismatch/ratio_outside": sum(1 for r in ratios if not 0.5 <= r <= 2.0) / n,
    }


def corrected_share(metrics: Mapping[str, float]) -> dict[str, float]:
    """The share of sampled tokens the loss's correction touched (truncated or masked), where
    the backend says (the local engine does)."""
    sampled = metrics.get("mismatch_tokens:sum", 0.0)
    if "corrected_tokens:sum" not in metrics or not sampled:
        return {}
    return {"mismatch/corrected": metrics["corrected_tokens:sum"] / sampled}
