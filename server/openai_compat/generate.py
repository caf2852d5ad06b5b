"""vLLM's token-in, token-out `POST /inference/v1/generate` (what verifiers' v1 trainers send):
its body, the worker's job made from it, and its answer: token ids, each with its logprob as
vLLM writes them (`token_id:<id>`), and the finish reason."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from server.openai_compat.schemas import (
    DEFAULT_MAX_TOKENS,
    MAX_CHOICES,
    MAX_TOKENS,
    ModelId,
    StrictIn,
)

TokenId = Annotated[int, Field(ge=0)]
MAX_PROMPT_TOKENS = 128_000


class GenerateSampling(StrictIn):
    """vLLM's SamplingParams, as far as this server samples them."""

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description=f"{DEFAULT_MAX_TOKENS} when left out"
    )
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, description="-1 or 0: no top-k")
    min_p: float | None = Field(None, ge=0.0, le=1.0, description="Only 0")
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    stop_token_ids: list[TokenId] | None = Field(
        None, max_length=64, description="Beside the model's end of turn"
    )
    logprobs: int | None = Field(
        None, ge=0, le=20, description="0 or 1: each sampled token's logprob (no alternatives)"
    )
    skip_special_tokens: bool | None = Field(
        None, description="Accepted (the answer carries token ids, not text)"
    )
    min_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    ignore_eos: bool | None = None

    @model_validator(mode="after")
    def _supported(self) -> GenerateSampling:
        if self.min_p:
            raise ValueError("min_p is not supported here; leave it out or set it to 0")
        if self.logprobs is not None and self.logprobs > 1:
            raise ValueError(
                "logprobs: only the sampled token's logprob is returned here; give 0 or 1"
            )
        return self

    def token_limit(self) -> int:
        return self.max_tokens or DEFAULT_MAX_TOKENS


class GenerateIn(StrictIn):
    """A prompt the caller rendered, as token ids, and how to sample its continuations."""

    model: ModelId
    token_ids: list[TokenId] = Field(min_length=1, max_length=MAX_PROMPT_TOKENS)
    sampling_params: GenerateSampling = Field(default_factory=GenerateSampling)
    cache_salt: str | None = Field(None, max_length=256, description="Accepted and ignored")


class GeneratedLogprob(BaseModel):
    token: str = Field(description="token_id:<id>")
    logprob: float


class GeneratedLogprobs(BaseModel):
    content: list[GeneratedLogprob]


class GeneratedChoice(BaseModel):
    index: int
    token_ids: list[int]
    logprobs: GeneratedLogprobs | None
    finish_reason: Literal["stop", "length"]


class GenerateOut(BaseModel):
    request_id: str
    choices: list[GeneratedChoice]
    prompt_token_ids: list[int]


def job_fields(body: GenerateIn) -> dict[str, Any]:
    """The worker's ChatJob fields this request sets (the prompt as token ids)."""
    params = body.sampling_params
    return {
        "prompt_ids": body.token_ids,
        "max_tokens": params.token_limit(),
        "temperature": 1.0 if params.temperature is None else params.temperature,
        "top_p": 1.0 if params.top_p is None else params.top_p,
        "top_k": -1 if not params.top_k else params.top_k,
        "n": params.n or 1,
        "stop_token_ids": params.stop_token_ids or [],
        "logprobs": bool(params.logprobs),
        "seed": params.seed,
        "min_tokens": params.min_tokens or 0,
        "ignore_eos": bool(params.ignore_eos),
        "token_ids": True,
    }


def generate_body(answer: dict[str, Any]) -> GenerateOut:
    """vLLM's answer from the worker's (token ids and logprobs aligned, one per token)."""
    choices = []
    for choice in answer["choices"]:
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = None
        if choice["logprobs"] is not None:
            values = [float(e["logprob"]) for e in choice["logprobs"]]
            logprobs = GeneratedLogprobs(
                content=[
                    GeneratedLogprob(token=f"token_id:{t}", logprob=v)
                    for t, v in zip(ids, values, strict=True)
                ]
            )
        choices.append(
            GeneratedChoice(
                index=choice["index"],
                token_ids=ids,
                logprobs=logprobs,
                finish_reason=choice["finish_reason"],
            )
        )
    return GenerateOut(
        request_id=f"generate-{uuid.uuid4().hex[:24]}",
        choices=choices,
        prompt_token_ids=[int(t) for t in answer["prompt_token_ids"]],
    )
