"""What the learner folds into the advantages besides the reward: the KL penalty against
tinker-cookbook 0.6.1's `incorporate_kl_penalty`, the distillation advantage against its
`distillation/train_on_policy.py`, their combination by weight (the datums gspo and
stable_reinforce need, trained on the local engine: tests/train/training/test_signals.py)."""

from __future__ import annotations

import asyncio
from typing import cast

import numpy as np
import pytest
import torch
from tinker import types

from runners.train.learner import (
    Sequence,
    assign_advantages,
    datum,
    fold_kl_penalty,
    fold_teacher,
)
from runners.train.scorers import Scorers


def batch() -> list[Sequence]:
    """Two groups of two, 3-token prompts, 2-4 sampled tokens with sampler logprobs."""
    out = []
    for i, (reward, sampled) in enumerate([(1.0, 2), (0.0, 3), (0.5, 4), (0.0, 2)]):
        n = 3 + sampled
        out.append(
            Sequence(
                tokens=list(range(20 + i, 20 + i + n)),
                trained=[False] * 3 + [True] * sampled,
                logprobs=[0.0] * 3 + [-0.1 * (i + 1) * (k + 1) for k in range(sampled)],
                reward=reward,
                group=i // 2,
                sample=i,
            )
        )
    return out


def other_logprobs(sequences: list[Sequence], shift: float) -> list[list[float]]:
    """A scorer's logprob of each token, as compute_logprobs answers (the first has none)."""
    return [
        [0.0] + [-0.05 * shift * (k % 3 + 1) - 0.02 * i for k in range(1, len(s.tokens))]
        for i, s in enumerate(sequences)
    ]


def cookbook_datums(sequences: list[Sequence]) -> list[types.Datum]:
    """The sequences as the cookbook's datums: shifted inputs, with its `mask` input."""
    out = []
    for s in sequences:
        made = datum(s)
        assert made is not None
        made.loss_fn_inputs["mask"] = types.TensorData.from_numpy(
            np.asarray(s.trained[1:], dtype=np.float32)
        )
        out.append(made)
    return out


def cookbook_kl_penalty(
    data: list[types.Datum], base_logprobs: list[list[float]], coef: float
) -> tuple[list[torch.Tensor], float]:
    """tinker_cookbook/rl/metrics.py's incorporate_kl_penalty (kl_discount_factor 0), on the
    logprobs its score_sequences would return: the new advantages and kl_policy_base."""
    sampled = [d.loss_fn_inputs["logprobs"].to_torch() for d in data]
    masks = [d.loss_fn_inputs["mask"].to_torch().float() for d in data]
    diffs = [
        (lp - torch.tensor(base[1:])) * mask
        for base, lp, mask in zip(base_logprobs, sampled, masks, strict=True)
    ]
    avg = sum(d.sum() for d in diffs) / sum(m.sum() for m in masks)
    out = [
        d.loss_fn_inputs["advantages"].to_torch() + coef * masks[i] * (avg - diffs[i])
        for i, d in enumerate(data)
    ]
    return out, float(avg)


def cookbook_distillation(
    data: list[types.Datum], teacher_logprobs: list[list[float]], coef: float
) -> tuple[list[torch.Tensor], float]:
    """tinker_cookbook/distillation/train_on_policy.py's incorporate_kl_penalty: the advantage
    gains -coef * (log p - log q) per masked token; teacher_kl is its mean."""
    sampled = [d.loss_fn_inputs["logprobs"].to_torch() for d in data]
    masks = [d.loss_fn_inputs["mask"].to_torch().float() for d in data]
    reverse = [
        (lp - torch.tensor(q[1:])) * mask
        for q, lp, mask in zip(teacher_logprobs, sampled, masks, strict=True)
    ]
    out = [
        d.loss_fn_inputs["advantages"].to_torch() - coef * masks[i] * reverse[i]
        for i, d in enumerate(data)
    ]
    return out, float(sum(r.sum() for r in reverse) / sum(m.sum() for m in masks))


def advantages_of(sequences: list[Sequence]) -> list[list[float]]:
    return [cast(list[float], s.advantages)[1:] for s in sequences]


def test_the_kl_penalty_is_the_cookbooks() -> None:
    sequences = assign_advantages(batch(), "grpo").sequences
    base = other_logprobs(sequences, 1.0)
    want, want_kl = cookbook_kl_penalty(cookbook_datums(sequences), base, 0.1)
    kl = fold_kl_penalty(sequences, base, 0.1)
    assert kl == pytest.approx(want_kl, abs=1e-6) and abs(kl) > 0.05
    for got, expected in zip(advantages_of(sequences), want, strict=True):
        assert got == pytest.approx(expected.tolist(), abs=1e-6)
    # Centred: the penalty moves no advantage on average, and none on a prompt token.
    trained = [
        a for s in sequences for a, t in zip(s.advantages or [], s.trained, strict=True) if t
    ]
    plain = [a for s in assign_advantages(batch(), "grpo").sequences for a in s.advantages or []]
    assert sum(trained) == pytest.approx(sum(plain), abs=1e-6)
    assert all(
        a == 0
        for s in sequences
        for a, t in zip(s.advantages or [], s.trained, strict=True)
        if not t
    )


def test_the_distillation_advantage_is_the_cookbooks() -> None:
    # Pure distillation: every reward 0, every group kept for the teacher's signal.
    sequences = batch()
    for s in sequences:
        s.reward = 0.0
    advantaged = assign_advantages(sequences, "grpo", keep_flat=True)
    assert advantaged.dropped_groups == 0 and len(advantaged.sequences) == 4
    teacher = other_logprobs(advantaged.sequences, 2.0)
    want, want_kl = cookbook_distillation(cookbook_datums(advantaged.sequences), teacher, 1.5)
    reverse_kl = fold_teacher(advantaged.sequences, teacher, 1.5)
    assert reverse_kl == pytest.approx(want_kl, abs=1e-6) and abs(reverse_kl) > 0.05
    for got, expected in zip(advantages_of(advantaged.sequences), want, strict=True):
        assert got == pytest.approx(expected.tolist(), abs=1e-6)
    # A token the teacher finds likelier than the sampler did gains; one it finds less, loses.
    first = advantaged.sequences[0]
    assert first.logprobs is not None and first.advantages is not None
    for lp, q, a, t in zip(
        first.logprobs, teacher[0], first.advantages, first.trained, strict=True
    ):
        if t:
            assert (a > 0) == (q > lp)


class FixedScorer:
    """A sampling client whose compute_logprobs answers given values (None first, as tinker)."""

    def __init__(self, values: dict[tuple[int, ...], list[float]]) -> None:
        self.values = values

    async def compute_logprobs(self, prompt: types.ModelInput) -> list[float | None]:
        return [None, *self.values[tuple(prompt.to_ints())][1:]]


def test_reward_kl_and_teacher_combine_by_their_weights() -> None:
    sequences = assign_advantages(batch(), "grpo").sequences
    base, teacher = other_logprobs(sequences, 1.0), other_logprobs(sequences, 2.0)
    plain = advantages_of(assign_advantages(batch(), "grpo").sequences)
    scorers = Scorers(
        reward_coef=0.5,
        reference=FixedScorer({tuple(s.tokens): b for s, b in zip(sequences, base, strict=True)}),
        kl_coef=0.1,
        teacher=FixedScorer({tuple(s.tokens): t for s, t in zip(sequences, teacher, strict=True)}),
        teacher_coef=2.0,
    )
    metrics = asyncio.run(scorers.fold(sequences))
    # By hand: 0.5 x the reward's advantage, then the cookbook's penalty, then the teacher's.
    expected = assign_advantages(batch(), "grpo").sequences
    for s in expected:
        s.advantages = [0.5 * a for a in s.advantages or []]
    kl = fold_kl_penalty(expected, base, 0.1)
    reverse_kl = fold_teacher(expected, teacher, 2.0)
    assert metrics == {"kl/reference": kl, "teacher/reverse_kl": reverse_kl}
    assert advantages_of(sequences) == advantages_of(expected) != plain
