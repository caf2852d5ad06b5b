"""A batch from the trajectory API (ScoredDataGroups: tokens, masks, scores, and what else the
environment filled) as the learner's sequences (runners/train/learner.py): the environment's
masks decide what trains, its scores are the rewards (with grpo its own per-token advantages
pass through), the sampler's logprobs are its `inference_logprobs`; groups that are malformed
or too long are dropped and counted, made-up data refused. The run's advantages are taken
after the staleness bound (RunnerBase.prepare); `Batch.settle` then applies the environment's
overrides to them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from core.failures import RunFailure
from runners.train.learner import AdvantageMode, Sequence

MASKED = -100  # atroposlib's mask value for tokens that are not trained on
DUMMY_LOGPROB = -0.5  # what atroposlib's DummyManagedServer makes up


class UnusableData(RunFailure):
    """The environment's data cannot be trained on at all (says why)."""

    category = "environment"


@dataclass
class Batch:
    # Read: every usable group's; settled: those trained, advantages set.
    sequences: list[Sequence] = field(default_factory=list)
    group_scores: list[list[float]] = field(default_factory=list)  # every received group's
    dropped: Counter[str] = field(default_factory=Counter)
    zeroed: set[int] = field(default_factory=set)  # samples the overrides train at advantage 0

    def settle(self, advantaged: list[Sequence], dropped_groups: int) -> list[Sequence]:
        """The sequences to train, from those given their advantages: the environment's
        overrides applied (`set_advantage_to_zero`), groups without signal counted, and those
        that train on nothing of the model's own output left out (their scores still counted
        in their groups')."""
        if dropped_groups:
            self.dropped["equal_scores"] += dropped_groups
        for sequence in advantaged:
            if sequence.sample in self.zeroed:
                sequence.advantages = [0.0] * len(sequence.tokens)
        self.sequences = [s for s in advantaged if any(s.trained[1:])]
        return self.sequences

    def reward_mean(self) -> float | None:
        """The mean of every received group's mean score (None when none had scores)."""
        means = [sum(g) / len(g) for g in self.group_scores if g]
        return sum(means) / len(means) if means else None

    def metrics(self) -> dict[str, float]:
        scores = [s for group in self.group_scores for s in group]
        out: dict[str, float] = {
            "env/num_groups": float(len(self.group_scores)),
            "env/num_episodes": float(len(scores)),
            "atropos/groups_received": float(len(self.group_scores)),
            "atropos/groups_dropped": float(sum(self.dropped.values())),
            **{f"atropos/dropped/{k}": float(v) for k, v in self.dropped.items()},
        }
        if scores:
            out["env/percent_correct"] = sum(1.0 for s in scores if s >= 1.0 - 1e-9) / len(scores)
            out["env/score_min"] = min(scores)
            out["env/score_max"] = max(scores)
        trained = [sum(s.trained[1:]) for s in self.sequences]
        if trained:
            out["sampler/action_num_tokens"] = sum(trained) / len(trained)
        return out


def read_batch(
    groups: list[dict[str, Any]], advantage: AdvantageMode, context: int | None
) -> Batch:
    """The batch's usable sequences, before the run's advantages (with grpo an environment's
    own per-token advantages pass through); groups that do not fit the model or are malformed
    are dropped and counted by reason."""
    batch = Batch()
    sequences: list[Sequence] = []
    for group in groups:
        scores = [float(s) for s in group.get("scores") or []]
        batch.group_scores.append(scores)
        why = _unusable(group, scores, context)
        if why is not None:
            batch.dropped[why] += 1
            continue
        # ReBN normalises every score of the batch: an environment's own advantages are used
        # with grpo, where they stand in for the group's.
        own = group.get("advantages") if advantage == "grpo" else None
        first = len(sequences)
        sequences += _sequences(group, scores, len(batch.group_scores), first, own or None)
        overrides = group.get("overrides") or []
        for i, override in enumerate(overrides[: len(scores)]):
            if isinstance(override, dict) and override.get("set_advantage_to_zero"):
                batch.zeroed.add(first + i)
    batch.sequences = sequences
    return batch


def _unusable(group: dict[str, Any], scores: list[float], context: int | None) -> str | None:
    tokens, masks = group.get("tokens") or [], group.get("masks") or []
    if not tokens or len(tokens) != len(masks) or len(tokens) != len(scores):
        return "malformed"
    if any(len(t) != len(m) or len(t) < 2 for t, m in zip(tokens, masks, strict=True)):
        return "malformed"
    if context is not None and any(len(t) > context for t in tokens):
        return "too_long"
    _check_not_dummy(group)
    return None


def _check_not_dummy(group: dict[str, Any]) -> None:
    """DummyManagedServer (ATROPOS_ALLOW_DUMMY_MANAGED_SERVER) makes up tokens 0..n and
    logprobs of -0.5: training on that would be training on noise."""
    for tokens, masks, logprobs in zip(
        group["tokens"], group["masks"], group.get("inference_logprobs") or [], strict=False
    ):
        out = [t for t, m in zip(tokens, masks, strict=True) if m != MASKED]
        lps = [lp for lp, m in zip(logprobs, masks, strict=False) if m != MASKED]
        if out and out == list(range(len(out))) and lps and all(lp == DUMMY_LOGPROB for lp in lps):
            raise UnusableData(
                "the environment sent made-up tokens (0, 1, 2, ...) with logprobs of -0.5: "
                "atroposlib's DummyManagedServer is in use (ATROPOS_ALLOW_DUMMY_MANAGED_SERVER); "
                "remove that from the environment"
            )


def _sequences(
    group: dict[str, Any],
    scores: list[float],
    group_id: int,
    first: int,
    own: list[list[float]] | None,
) -> list[Sequence]:
    """The group's sequences for the learner, numbered from `first` (one sample each)."""
    out = []
    logprobs = group.get("inference_logprobs") or []
    for i, (tokens, masks) in enumerate(zip(group["tokens"], group["masks"], strict=True)):
        advantages = None
        if own is not None:
            advantages = [float(a) for a in own[i]]
            if len(advantages) != len(tokens):
                raise UnusableData(
                    f"the environment's advantages for a sequence of {len(tokens)} tokens "
                    f"have {len(advantages)} values"
                )
        lp = logprobs[i] if i < len(logprobs) else None
        out.append(
            Sequence(
                tokens=list(tokens),
                trained=[m != MASKED for m in masks],
                logprobs=[float(x) for x in lp] if lp and len(lp) == len(tokens) else None,
                reward=scores[i],
                group=group_id,
                sample=first + i,
                advantages=advantages,
            )
        )
    return out
