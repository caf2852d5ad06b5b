"""A batch from the trajectory API (ScoredDataGroups: tokens, masks, scores, and what else the
environment filled) into training data: advantages from the scores as the run's advantage mode
says (or the environment's own per-token advantages), the environment's masks, the sampler's
logprobs, and datums shaped as tinker's losses take them.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tinker import types

from core.failures import RunFailure

MASKED = -100  # atroposlib's mask value for tokens that are not trained on
DUMMY_LOGPROB = -0.5  # what atroposlib's DummyManagedServer makes up


class UnusableData(RunFailure):
    """The environment's data cannot be trained on at all (says why)."""

    category = "environment"


@dataclass
class Sequence:
    tokens: list[int]
    trained: list[bool]  # per token: in the loss (the environment's mask is not -100)
    logprobs: list[float] | None  # the sampler's, per token; None: recompute them
    advantages: list[float]  # per token (zero where not trained)
    score: float


@dataclass
class Batch:
    sequences: list[Sequence] = field(default_factory=list)
    group_scores: list[list[float]] = field(default_factory=list)  # every received group's
    dropped: Counter[str] = field(default_factory=Counter)

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
            means = [sum(g) / len(g) for g in self.group_scores if g]
            out["reward/mean"] = out["env/reward_mean"] = sum(means) / len(means)
            out["env/percent_correct"] = sum(1.0 for s in scores if s >= 1.0 - 1e-9) / len(scores)
            out["env/score_min"] = min(scores)
            out["env/score_max"] = max(scores)
        trained = [sum(s.trained[1:]) for s in self.sequences]
        if trained:
            out["sampler/action_num_tokens"] = sum(trained) / len(trained)
        return out


def read_batch(
    groups: list[dict[str, Any]], advantage: str, scale_by_std: bool, context: int | None
) -> Batch:
    """The batch's usable sequences with their advantages; groups that teach nothing or do
    not fit the model are dropped and counted by reason."""
    batch = Batch()
    kept: list[tuple[dict[str, Any], list[float]]] = []
    for group in groups:
        scores = [float(s) for s in group.get("scores") or []]
        batch.group_scores.append(scores)
        why = _unusable(group, scores, context)
        if why is not None:
            batch.dropped[why] += 1
            continue
        kept.append((group, scores))
    if advantage == "rebn":
        flat = [s for _, scores in kept for s in scores]
        advantages = _zscores(flat)
        if advantages is None:
            batch.dropped["equal_scores"] += len(kept)
            return batch
        at = 0
        for group, scores in kept:
            batch.sequences += _sequences(group, scores, advantages[at : at + len(scores)])
            at += len(scores)
        return batch
    for group, scores in kept:
        given = group.get("advantages")
        if given:  # the environment's own, per token
            batch.sequences += _sequences(group, scores, None)
            continue
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
        if len(scores) < 2 or std < 1e-8:
            batch.dropped["equal_scores"] += 1
            continue
        values = [(s - mean) / (std + 1e-6) if scale_by_std else s - mean for s in scores]
        batch.sequences += _sequences(group, scores, values)
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


def _zscores(values: list[float]) -> list[float] | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    if std < 1e-8:
        return None
    return [(v - mean) / (std + 1e-9) for v in values]


def _sequences(
    group: dict[str, Any], scores: list[float], advantages: list[float] | None
) -> list[Sequence]:
    out = []
    logprobs = group.get("inference_logprobs") or []
    given = group.get("advantages") or []
    overrides = group.get("overrides") or []
    for i, (tokens, masks) in enumerate(zip(group["tokens"], group["masks"], strict=True)):
        trained = [m != MASKED for m in masks]
        if not any(trained[1:]):
            continue  # nothing of it is the model's own output
        if advantages is None:
            per_token = [float(a) for a in given[i]]
            if len(per_token) != len(tokens):
                raise UnusableData(
                    f"the environment's advantages for a sequence of {len(tokens)} tokens "
                    f"have {len(per_token)} values"
                )
        else:
            per_token = [advantages[i]] * len(tokens)
        override = overrides[i] if i < len(overrides) and isinstance(overrides[i], dict) else {}
        if override.get("set_advantage_to_zero"):
            per_token = [0.0] * len(tokens)
        lp = logprobs[i] if i < len(logprobs) else None
        out.append(
            Sequence(
                tokens=list(tokens),
                trained=trained,
                logprobs=[float(x) for x in lp] if lp and len(lp) == len(tokens) else None,
                advantages=[a if t else 0.0 for a, t in zip(per_token, trained, strict=True)],
                score=scores[i],
            )
        )
    return out


def datum(sequence: Sequence) -> types.Datum:
    """Input = tokens[:-1], target = tokens[1:]; the sampler's logprobs and the advantage sit
    on the trained targets only."""
    assert sequence.logprobs is not None, "logprobs are filled in before datums are made"
    trained = sequence.trained[1:]
    sampled = sequence.logprobs[1:]
    inputs: dict[str, Any] = {  # lists: the Datum makes them TensorData
        "target_tokens": sequence.tokens[1:],
        "logprobs": [lp if t else 0.0 for lp, t in zip(sampled, trained, strict=True)],
        "advantages": sequence.advantages[1:],
    }
    return types.Datum(
        model_input=types.ModelInput.from_ints(sequence.tokens[:-1]), loss_fn_inputs=inputs
    )


def kl_metrics(sequences: list[Sequence], outputs: list[dict[str, Any]]) -> dict[str, float]:
    """Sampler vs learner logprobs on the trained tokens (as runners.train.datums computes)."""
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
