"""The learner, written once (DESIGN §7): what every driver hands it and what it does with it.

    native loop (runners/train/loop.py): Episodes, one Sequence per turn  ─┐
    Atropos trainer (runners/atropos/): ScoredDataGroups, one per sequence ─┴─> [Sequence]
        tokens, trained mask, sampler logprobs, reward, group, sample (, own advantages)
    -> assign_advantages: grpo (group-relative) | rebn (batch-normalised returns) | own
    -> datum per sequence (tinker's shape) -> train_on: forward_backward + optim_step
    -> train/* metrics and the sampler/learner KL

Drivers keep what is theirs: sampling or reading a batch, their data's metrics, checkpoints.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from tinker import types

from runners.episodes.policy import bounded

if TYPE_CHECKING:
    from collections.abc import Mapping

    from runners.backends.surface import TrainingClient

AdvantageMode = Literal["grpo", "rebn"]
# A native turn's place in its step, (sample, turn) under this meta key: how its rollout record
# finds the advantage it was trained with.
TURN = "turn"


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
) -> Advantaged:
    """Each sequence's per-token advantages (DESIGN §7), set in place; sequences that came
    with their own keep them, masked to their trained tokens.

    `grpo`: a sample's return minus its group's mean (over its std with `scale_by_std`);
    groups whose returns are all equal teach nothing and are dropped. `rebn`: per-turn
    discounted returns (`gamma`) z-scored across the batch, as the GEM reference trainer
    does; with more than `limit` sequences a random subset of `limit` (`seed`) is kept.
    """
    for sequence in sequences:
        if sequence.advantages is not None:
            sequence.advantages = _on_trained(sequence, sequence.advantages)
    todo = [s for s in sequences if s.advantages is None]
    if mode == "rebn":
        dropped = _rebn(todo, gamma)
        kept = [s for s in sequences if s.advantages is not None]
        if limit is not None and len(kept) > limit:
            kept = random.Random(seed).sample(kept, limit)
        return Advantaged(kept, dropped)
    dropped = sum(_grpo(members, scale_by_std) for members in _grouped(todo, "group"))
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


# Training --------------------------------------------------------------------------------


def datum(sequence: Sequence) -> types.Datum | None:
    """Input = tokens[:-1], target = tokens[1:]; the sampler's logprobs and the advantages sit
    on the trained targets only. None when no target is trained."""
    targets = sequence.trained[1:]
    if not any(targets):
        return None
    assert sequence.logprobs is not None, "logprobs are filled in before datums are made"
    assert sequence.advantages is not None, "advantages are assigned before datums are made"
    sampled = [lp if t else 0.0 for lp, t in zip(sequence.logprobs[1:], targets, strict=True)]
    # As Datum would convert plain lists (int64 targets, float32 values), done here so the
    # values have the type its field declares.
    return types.Datum(
        model_input=types.ModelInput.from_ints(sequence.tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": _tensor(sequence.tokens[1:], np.int64),
            "logprobs": _tensor(sampled, np.float32),
            "advantages": _tensor(sequence.advantages[1:], np.float32),
        },
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
        made = datum(sequence)
        if made is not None:
            kept.append(sequence)
            datums.append(made)
    if not datums:
        return {}
    fwd_bwd = training.forward_backward(datums, loss_fn, dict(loss_fn_config))
    optim = training.optim_step(adam)
    result = await bounded(fwd_bwd, timeout_s, "forward_backward")
    await bounded(optim, timeout_s, "optim_step")
    tokens = sum(sum(s.trained[1:]) for s in kept)
    loss_sum = float(result.metrics.get("loss:sum", 0.0))
    return {
        "train/loss": loss_sum / max(1, tokens),
        "train/loss_sum": loss_sum,
        "train/num_datums": float(len(datums)),
        "train/num_action_tokens": float(tokens),
        **kl_metrics(kept, result.loss_fn_outputs),
    }


def kl_metrics(sequences: list[Sequence], outputs: list[dict[str, Any]]) -> dict[str, float]:
    """Sampler vs learner logprobs on the trained targets (as the reference script computes),
    and the sampler's entropy estimate over them."""
    diffs: list[float] = []
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
    return {
        "train/kl_sample_train_v1": sum(diffs) / len(diffs),
        "train/kl_sample_train_v2": 0.5 * sum(d * d for d in diffs) / len(diffs),
        "sampler/token_entropy": -sum(sampled) / len(sampled),
    }
