"""Answers of the rollout routes: a page of a run's recorded episodes, and its steps' records."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class SegmentOut(BaseModel):
    role: Literal["env", "model"] = Field(
        description="env: the environment's text (an observation, a prompt); model: tokens the "
        "model sampled"
    )
    text: str
    tokens: int
    reward: float | None = Field(None, description="A model turn's reward")
    advantage: float | None = Field(None, description="What the turn's tokens were trained with")


class RolloutOut(BaseModel):
    step: int
    kind: str = Field(description="episode (our runs), sequence (Atropos), sample or datum")
    group: int | None = Field(description="Its group (one task's episodes) within the step")
    index: int = Field(description="Its place among the step's episodes")
    prompt: str = Field(description="The first prompt, as the environment gave it")
    completion: str = Field(description="The model's text (its turns, one per line)")
    reward: float | None = Field(description="The episode's return (None: no reward known)")
    advantage: float | None = Field(description="Its advantage (None: not trained on)")
    finish_reason: str | None = Field(
        description="stop (the model ended its turn) or length (cut at max tokens)"
    )
    prompt_tokens: int
    completion_tokens: int
    logprob_mean: float | None = Field(description="The sampler's mean logprob of its tokens")
    turns: int
    source: str = Field(description="Its environment, in a run mixing several")
    trained: bool = Field(description="False: its group taught nothing and was dropped")
    picked: str = Field(
        description="Why it was kept: all (the step had at most rollouts_per_step), best, worst "
        "or random (a seeded sample of the rest)"
    )
    prompt_key: str = Field(description="The same prompt in every step (filter prompt_key=)")
    metrics: dict[str, float | None] = Field(description="The environment's, for this episode")
    segments: list[SegmentOut] = Field(
        description="The episode in order: the environment's text and the model's tokens apart"
    )
    messages: list[dict[str, str]] | None = Field(
        None, description="The chat, where the environment sent one (Atropos)"
    )


class RolloutPageOut(BaseModel):
    run_id: str
    items: list[RolloutOut]
    next_cursor: str | None = Field(
        description="Pass as cursor= for the next page; null on the last page"
    )


class RolloutStepOut(BaseModel):
    step: int
    kind: str
    sampled: int = Field(description="Episodes the step had")
    recorded: int = Field(description="Kept when the step was recorded (rollouts_per_step)")
    kept: int = Field(description="Kept now (the run's size cap thins older steps first)")
    size_bytes: int
    reward_mean: float | None = Field(description="Over every episode the step had")
    reward_min: float | None
    reward_max: float | None
    metrics: dict[str, float | None] = Field(description="The environment's step metrics")
    note: str | None = Field(description="What happened to the record (thinned, stopped)")


class RolloutStepsOut(BaseModel):
    run_id: str
    rollouts_per_step: int = Field(description="The run's setting (0: not recorded)")
    rollouts_max_mb: float = Field(description="The run's size cap")
    size_bytes: int = Field(description="What the run's record holds now")
    steps: list[RolloutStepOut]
