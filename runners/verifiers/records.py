"""A step's verifiers rollouts as rollout records (core/rollouts.py): each rollout's chat (the
prompt's messages, then the environment's and the model's turns), its reward, the rubric's
metrics, and the advantage it was trained with (None where it was left out)."""

from __future__ import annotations

from typing import Any

from core.rollouts import RolloutRecord, Segment
from runners.verifiers.groups import Batch


def rollout_records(batch: Batch) -> list[RolloutRecord]:
    by_sample: dict[int, list[float]] = {}
    for sequence in batch.sequences:
        advantage = sequence.mean_advantage()
        if advantage is not None:
            by_sample.setdefault(sequence.sample, []).append(advantage)
    out: list[RolloutRecord] = []
    for group_index, group in enumerate(batch.groups):
        for rollout in group.rollouts:
            sample = len(out)
            prompt = _messages(rollout.prompt)
            completion = _messages(rollout.completion)
            advantages = by_sample.get(sample)
            model_turns = [m for m in completion if m["role"] == "assistant"]
            out.append(
                RolloutRecord(
                    kind="episode",
                    group=group_index,
                    index=sample,
                    prompt=prompt[-1]["content"] if prompt else "",
                    completion="\n".join(m["content"] for m in model_turns),
                    reward=rollout.reward,
                    advantage=sum(advantages) / len(advantages) if advantages else None,
                    segments=[
                        Segment("model" if m["role"] == "assistant" else "env", m["content"])
                        for m in prompt + completion
                    ],
                    finish_reason="length" if rollout.truncated else None,
                    prompt_tokens=rollout.prompt_tokens(),
                    completion_tokens=rollout.sampled_tokens(),
                    metrics=dict(rollout.metrics),
                    turns=max(1, len(model_turns)),
                    trained=advantages is not None,
                    messages=prompt + completion or None,
                )
            )
    return out


def _messages(value: list[dict[str, Any]] | str) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}] if value else []
    out = []
    for message in value:
        content = message.get("content")
        text = content if isinstance(content, str) else repr(content)
        out.append({"role": str(message.get("role", "")), "content": text})
    return out
