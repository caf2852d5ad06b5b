"""Datums: one per transition, shaped as tinker's losses expect, and the sampler/learner KL.

Input = (prompt + action)[:-1], target = (prompt + action)[1:]; the advantage and the
sampler's logprobs sit on the action tokens only (zeros on the prompt).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tinker import types

from runners.train.advantages import Weighted


def make_datum(item: Weighted) -> types.Datum | None:
    """Input = (prompt + action)[:-1], target = (prompt + action)[1:]; the advantage and the
    sampler's logprobs sit on the action tokens only (zeros on the prompt)."""
    t = item.transition
    if not t.action_tokens or not t.prompt_tokens:
        return None
    tokens = t.prompt_tokens + t.action_tokens
    prompt_part = len(t.prompt_tokens) - 1
    logprobs = [0.0] * prompt_part + [float(x) for x in t.action_logprobs]
    advantages = [0.0] * prompt_part + [float(item.advantage)] * len(t.action_tokens)
    # As Datum would convert plain lists (int64 targets, float32 values), done here so the
    # values have the type its field declares.
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray(tokens[1:], dtype=np.int64)),
            "logprobs": types.TensorData.from_numpy(np.asarray(logprobs, dtype=np.float32)),
            "advantages": types.TensorData.from_numpy(np.asarray(advantages, dtype=np.float32)),
        },
    )


def make_datums(items: list[Weighted]) -> tuple[list[types.Datum], list[Weighted]]:
    datums, kept = [], []
    for item in items:
        datum = make_datum(item)
        if datum is not None:
            datums.append(datum)
            kept.append(item)
    return datums, kept


def kl_metrics(kept: list[Weighted], outputs: list[dict[str, Any]]) -> dict[str, float]:
    """Sampler vs learner logprobs on the action tokens (as the reference script computes)."""
    diffs: list[float] = []
    sampled: list[float] = []
    for item, output in zip(kept, outputs, strict=True):
        n = len(item.transition.action_tokens)
        learner = output["logprobs"].tolist()[-n:]
        sampler = item.transition.action_logprobs
        sampled.extend(sampler)
        diffs.extend(q - p for q, p in zip(sampler, learner, strict=True))
    if not diffs:
        return {}
    return {
        "train/kl_sample_train_v1": sum(diffs) / len(diffs),
        "train/kl_sample_train_v2": 0.5 * sum(d * d for d in diffs) / len(diffs),
        "sampler/token_entropy": -sum(sampled) / len(sampled),
    }
