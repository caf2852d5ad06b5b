"""The JSON bodies the Tinker SDK 0.38 sends, as far as this server reads them.

Unknown fields are ignored rather than refused (unlike our own routes): they are the SDK's
protocol, and a newer SDK adds fields the hosted service reads and we need not.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

JsonObject = dict[str, Any]  # what the routes answer: the SDK's JSON, as its types read it


class WireIn(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CreateSessionIn(WireIn):
    tags: list[str] = Field(default_factory=list, max_length=100)
    user_metadata: dict[str, Any] | None = None
    sdk_version: str = Field("", max_length=64)
    project_id: str | None = Field(None, max_length=200)
    display_name: str | None = Field(None, max_length=200)


class SessionIn(WireIn):
    session_id: str = Field(max_length=64)


class FinishReason(WireIn):
    type: str = Field("success", max_length=32)


class FinishIn(WireIn):
    reason: FinishReason = Field(default_factory=FinishReason)
    detail: str | None = Field(None, max_length=10_000)


class LoraIn(WireIn):
    rank: int = Field(32, ge=1, le=1024)
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class CreateModelIn(WireIn):
    session_id: str = Field(max_length=64)
    model_seq_id: int = Field(ge=0)
    base_model: str = Field(min_length=1, max_length=500)
    lora_config: LoraIn = Field(default_factory=LoraIn)
    user_metadata: dict[str, Any] | None = None
    optimizer_config: dict[str, Any] | None = None


class ModelIn(WireIn):
    model_id: str = Field(max_length=100)


class SeqIn(ModelIn):
    seq_id: int | None = None


class OptimStepIn(SeqIn):
    adam_params: dict[str, Any] | None = None
    optimizer_params: dict[str, Any] | None = None
    optim_params: dict[str, Any] | None = None

    def params(self) -> dict[str, Any]:
        if self.adam_params is not None:
            return {"type": "adam", **self.adam_params}
        chosen = self.optimizer_params or self.optim_params or {}
        return {"type": "adam", **chosen} if "type" not in chosen else dict(chosen)


class SaveWeightsIn(SeqIn):
    path: str | None = Field(None, max_length=200)
    overwrite: bool = False
    ttl_seconds: int | None = None
    user_metadata: dict[str, str] | None = None


class SaveExternalIn(SeqIn):
    path: str = Field(max_length=200)
    ttl_seconds: int | None = None
    age_encryption_recipients: list[str] | None = None


class SaveSamplerIn(SeqIn):
    path: str | None = Field(None, max_length=200)
    sampling_session_seq_id: int | None = None
    kind: str = "snapshot"
    ttl_seconds: int | None = None
    user_metadata: dict[str, str] | None = None


class LoadWeightsIn(WireIn):
    path: str = Field(max_length=500)
    optimizer: bool = False
    # The deprecated form loads into an existing model; the current one makes a new model.
    model_id: str | None = Field(None, max_length=100)
    seq_id: int | None = None
    session_id: str | None = Field(None, max_length=64)
    model_seq_id: int | None = Field(None, ge=0)
    base_model: str | None = Field(None, max_length=500)
    user_metadata: dict[str, Any] | None = None


class CreateSamplerIn(WireIn):
    session_id: str = Field(max_length=64)
    sampling_session_seq_id: int = Field(ge=0)
    base_model: str | None = Field(None, max_length=500)
    model_path: str | None = Field(None, max_length=500)


class SampleIn(WireIn):
    sampling_session_id: str | None = Field(None, max_length=100)
    seq_id: int | None = None
    num_samples: int = Field(1, ge=1, le=4096)
    prompt: dict[str, Any]
    sampling_params: dict[str, Any]
    base_model: str | None = None
    model_path: str | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: dict[str, Any] | None = None
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    record_stability_info: bool | None = None


class RetrieveIn(WireIn):
    request_id: str = Field(max_length=200)
    allow_metadata_only: bool = False


class WeightsInfoIn(WireIn):
    tinker_path: str = Field(max_length=500)


class TtlIn(WireIn):
    ttl_seconds: int | None = None


class CopyWeightsIn(WireIn):
    source_path: str = Field(max_length=500)
    session_id: str | None = Field(None, max_length=64)
    model_seq_id: int | None = Field(None, ge=0, le=999_999)
    destination_project_id: str | None = Field(None, max_length=200)
    ttl_seconds: int | None = None


class SearchCursorIn(WireIn):
    last_created_at: datetime
    last_session_id: str = Field(max_length=64)


class SessionSearchIn(WireIn):
    """The SDK's SessionSearchRequest; owner and statuses as their tagged objects."""

    session_id: str | None = Field(None, max_length=64)
    project_ids: list[str] | None = Field(None, max_length=100)
    user_metadata: dict[str, str] = Field(default_factory=dict)
    display_name: str | None = Field(None, min_length=1, max_length=200)
    owner: dict[str, Any] = Field(default_factory=lambda: {"type": "own"})
    statuses: list[dict[str, Any]] | None = Field(None, min_length=1, max_length=10)
    limit: int = Field(50, ge=1, le=200)
    cursor: SearchCursorIn | None = None


class ProjectIn(WireIn):
    project_id: str = Field(max_length=200)


class JoinSamplerIn(WireIn):
    sampling_session_id: str = Field(max_length=100)


class FuturesTargetIn(WireIn):
    type: str = "sampling_session"
    sampling_session_id: str = Field(max_length=100)
    cloned_sampler_id: int = Field(0, ge=0)


class FuturesIn(WireIn):
    target: FuturesTargetIn
    prev_cursor: int = Field(0, ge=0)
    timeout: float | None = Field(None, ge=0)
    retrieved_request_ids: list[str] = Field(default_factory=list, max_length=10_000)


class CancelIn(WireIn):
    request_id: str = Field(max_length=200)


class CreateLossIn(WireIn):
    """The SDK's CreateCustomLossRequest: a traced loss as plain data (the worker rebuilds it)."""

    session_id: str = Field(max_length=64)
    custom_loss_seq_id: int = Field(ge=0)
    name: str = Field(max_length=200)
    inputs: list[dict[str, Any]] = Field(min_length=1, max_length=16)
    graph: dict[str, Any]
