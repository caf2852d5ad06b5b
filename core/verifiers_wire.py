"""What a verifiers run's driver (runners/verifiers/envside/drive.py, in the verifiers
interpreter) and its runner say to each other, one JSON line each: the driver's first line says
the environment loaded (or why not), then each `Roll` the runner sends gets one `Group` (or a
`Failed` naming it). The driver writes the same JSON with the stdlib (nothing of ours imports in
its interpreter); these models validate it when it is read.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from core.line import Line


class Roll(Line):
    """Runner to driver: play one dataset example `size` times (a group) and score it."""

    kind: Literal["roll"] = "roll"
    id: int = Field(ge=0)
    example: int = Field(ge=0, description="index into the split, wrapped around its length")
    split: Literal["train", "eval"] = "train"
    size: int = Field(ge=1)
    sampling: dict[str, Any] = Field(description="the chat request's sampling fields")


class Ready(Line):
    """The environment loaded: its class and how many examples each split holds (0: a v1
    taskset without end)."""

    kind: Literal["ready"] = "ready"
    env_type: str
    examples: int = Field(ge=0)
    eval_examples: int = Field(ge=0)


class Step(Line):
    """One model call of a rollout, as verifiers recorded it from the face's answer."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    completion_mask: list[int]


class Rollout(Line):
    """One scored rollout: its reward and the rubric's metrics, its model calls, and its text
    for the rollout viewer and test inference."""

    reward: float
    metrics: dict[str, float] = Field(default_factory=dict)
    steps: list[Step]
    prompt: list[dict[str, Any]] | str
    completion: list[dict[str, Any]] | str
    answer: str | None = None
    truncated: bool = False
    error: str | None = None

    def sampled_tokens(self) -> int:
        """The tokens the model sampled, over its model calls."""
        return sum(sum(1 for m in step.completion_mask if m) for step in self.steps)

    def prompt_tokens(self) -> int:
        """The first model call's prompt: its prompt ids, and the tokens before the first
        sampled one (a v1 call comes as one token list, its prompt unmasked)."""
        if not self.steps:
            return 0
        first = self.steps[0]
        mask = first.completion_mask
        return len(first.prompt_ids) + (mask.index(1) if 1 in mask else len(mask))


class Group(Line):
    kind: Literal["group"] = "group"
    id: int
    example: int
    rollouts: list[Rollout]


class Failed(Line):
    """The environment failed to load (`id` None) or to play a roll (its id)."""

    kind: Literal["failed"] = "failed"
    id: int | None = None
    error: str


DriverLine = Annotated[Ready | Group | Failed, Field(discriminator="kind")]
DRIVER_LINE: TypeAdapter[DriverLine] = TypeAdapter(DriverLine)
