"""A step's scored groups from the trajectory API as rollout records (core/rollouts.py): each
sequence's tokens split by the environment's mask into its text (masked) and the model's
(trained), its score, the advantage it was trained with, its messages where the environment
sent them, and the sampler's mean logprob."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.rollouts import RolloutRecord, Segment
from runners.atropos.groups import MASKED
from runners.train.learner import Sequence


def sequence_records(
    groups: list[dict[str, Any]],
    trained: list[Sequence],
    decode: Callable[[list[int]], str],
    stop_ids: list[int],
) -> list[RolloutRecord]:
    """Every sequence of every group received (those of dropped groups too, untrained), in the
    order received. `trained`: read_batch's sequences, which keep the groups' order."""
    stops = set(stop_ids)
    out: list[RolloutRecord] = []
    pending = iter(trained)
    current = next(pending, None)
    for group_index, group in enumerate(groups):
        scores = group.get("scores") or []
        masks = group.get("masks") or []
        messages = group.get("messages") or []
        overrides = group.get("overrides") or []
        for i, tokens in enumerate(group.get("tokens") or []):
            mask = masks[i] if i < len(masks) and len(masks[i]) == len(tokens) else None
            on = [m != MASKED for m in mask] if mask is not None else [False] * len(tokens)
            # read_batch kept this one if it is the next trained sequence (same tokens).
            sequence = None
            if current is not None and current.tokens == list(tokens):
                sequence, current = current, next(pending, None)
            segments = _segments(list(tokens), on, decode)
            model = [t for t, o in zip(tokens, on, strict=True) if o]
            out.append(
                RolloutRecord(
                    kind="sequence",
                    group=group_index,
                    index=len(out),
                    prompt=next((s.text for s in segments if s.role == "env"), ""),
                    completion="\n".join(s.text for s in segments if s.role == "model"),
                    reward=float(scores[i]) if i < len(scores) else None,
                    advantage=_advantage(sequence),
                    segments=segments,
                    finish_reason=("stop" if model[-1] in stops else None) if model else None,
                    prompt_tokens=len(tokens) - len(model),
                    completion_tokens=len(model),
                    logprob_mean=_logprob_mean(sequence),
                    metrics=_numbers(overrides[i] if i < len(overrides) else None),
                    trained=sequence is not None,
                    messages=_messages(messages[i] if i < len(messages) else None),
                )
            )
    return out


def _segments(
    tokens: list[int], on: list[bool], decode: Callable[[list[int]], str]
) -> list[Segment]:
    """Runs of the environment's tokens and the model's, each decoded on its own."""
    out: list[Segment] = []
    start = 0
    for end in range(1, len(tokens) + 1):
        if end == len(tokens) or on[end] != on[start]:
            run = tokens[start:end]
            out.append(Segment("model" if on[start] else "env", decode(run), len(run)))
            start = end
    return out


def _advantage(sequence: Sequence | None) -> float | None:
    return None if sequence is None else sequence.mean_advantage()


def _logprob_mean(sequence: Sequence | None) -> float | None:
    if sequence is None or sequence.logprobs is None:
        return None
    values = [lp for lp, t in zip(sequence.logprobs, sequence.trained, strict=True) if t]
    return sum(values) / len(values) if values else None


def _numbers(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in value.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _messages(value: Any) -> list[dict[str, str]] | None:
    """The chat as {role, content} pairs (content that is not text, as JSON would show it)."""
    if not isinstance(value, list):
        return None
    out = []
    for message in value:
        if isinstance(message, dict):
            content = message.get("content")
            text = content if isinstance(content, str) else repr(content)
            out.append({"role": str(message.get("role", "")), "content": text})
    return out or None
