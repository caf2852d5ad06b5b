"""Bodies of POST /test/inference."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    Field,
    create_model,
    model_validator,
)

from core.models import RUN_ID
from server.schemas import Prompt, Request


class InferenceIn(Request):
    """Free `prompts`, or `num_items` tasks drawn from the environment (held-out split)."""

    # Both capped by RLCS_INFERENCE_MAX_PROMPTS: see `inference_in`.
    prompts: list[Prompt] | None = Field(None, min_length=1)
    max_tokens: int = Field(256, ge=1, le=4096)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    environment: str | None = Field(
        None, min_length=1, max_length=128, description="Default: the selected environment"
    )
    model: str | None = Field(
        None, min_length=1, max_length=256, description="Default: the environment's model_name"
    )
    run_id: str | None = Field(
        None, pattern=RUN_ID.pattern, description="Sample from this run's trained adapter"
    )
    checkpoint_step: int | None = Field(
        None, ge=0, le=1_000_000, description="Which of the run's checkpoints (default: last)"
    )
    num_items: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _one_source(self) -> InferenceIn:
        if (self.prompts is None) == (self.num_items is None):
            raise ValueError("give either prompts (a list of strings) or num_items, not both")
        if self.model is not None and self.run_id is not None:
            raise ValueError("give model or run_id, not both (a run fixes its model)")
        if self.checkpoint_step is not None and self.run_id is None:
            raise ValueError("checkpoint_step needs run_id")
        return self


def inference_in(max_prompts: int) -> type[InferenceIn]:
    """InferenceIn with the server's prompt cap (the setting inference_max_prompts)."""
    return create_model(
        "InferenceIn",
        __base__=InferenceIn,
        __doc__=InferenceIn.__doc__,
        prompts=(list[Prompt] | None, Field(None, min_length=1, max_length=max_prompts)),
        num_items=(int | None, Field(None, ge=1, le=max_prompts)),
    )


class InferenceResult(BaseModel):
    prompt: str | None
    response: str
    score: float | None
    correct: bool | None
    reason: str | None = None
    truncated: bool = Field(
        False, description="Cut short by the request's time budget or the model's context"
    )
    tokens: int
    turns: list[dict[str, Any]] | None = None


class InferenceSummaryOut(BaseModel):
    count: int
    scored: int = Field(description="Results the verifier could score")
    mean_score: float | None
    percent_correct: float | None = Field(description="Of the results scored")
    tokens: int = Field(description="Tokens sampled, all results together")
    truncated: int = Field(description="Results cut short")
    latency_s: float


class InferenceOut(BaseModel):
    environment: str
    model: str
    adapter: str | None
    backend: str
    results: list[InferenceResult]
    summary: InferenceSummaryOut
