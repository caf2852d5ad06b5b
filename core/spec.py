"""What crosses from the server to a runner or the inference worker, typed: written once by
the server, validated when read. A run's spec is its folder's frozen config.json."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.frameworks import Framework


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvSource(_Frozen):
    """One environment a run (or an inference request) plays: its class, file and config."""

    env_file: str
    env_class: str
    config: dict[str, Any]
    weight: float = 1.0
    framework: Framework = "rlcs"


class RunSpec(_Frozen):
    """A run as frozen at POST /runs: its environment(s) and resolved config, with its hash."""

    run_id: str
    environment: str
    env_file: str
    env_class: str
    config_hash: str
    config: dict[str, Any]
    # Multi-environment runs: every environment of the mix by name (this one included).
    mix: dict[str, EnvSource] | None = None
    framework: Framework = "rlcs"

    def sources(self) -> dict[str, EnvSource]:
        """The environments to train on, by name, the run's own first."""
        if self.mix:
            return dict(self.mix)
        own = EnvSource(
            env_file=self.env_file,
            env_class=self.env_class,
            config=self.config,
            framework=self.framework,
        )
        return {self.environment: own}

    def with_config(self, config: dict[str, Any], config_hash: str) -> RunSpec:
        """The same run under a changed config (a resume with overrides)."""
        return self.model_copy(update={"config": config, "config_hash": config_hash})


class ResumePoint(_Frozen):
    """Written by POST /runs/{id}/resume: the state checkpoint the next attempt starts from."""

    state_path: str
    step: int = Field(ge=0)


class InferenceJob(_Frozen):
    """One /test/inference request as the worker receives it."""

    op: Literal["infer"] = "infer"
    source: EnvSource
    model: str
    adapter: str | None = None
    prompts: list[str] | None = None
    num_items: int | None = None
    max_tokens: int
    temperature: float
    seed: int | None = None
    deadline: float | None = Field(None, description="epoch seconds; sampling stops there")
    budget_s: float | None = None


class ChatMessage(_Frozen):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    # An assistant's earlier tool calls (OpenAI's shape), and the call a tool's answer answers.
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatJob(_Frozen):
    """One /v1/chat/completions request as the worker receives it: messages in, `n` choices
    out; with `stream` the worker also writes partial lines of new text as it decodes. A vLLM
    `generate` request is one too, its prompt given as token ids instead of messages."""

    op: Literal["chat"] = "chat"
    model: str
    adapter: str | None = None
    backend: Literal["local", "tinker"]
    messages: list[ChatMessage] = Field(default_factory=list)
    prompt_ids: list[int] | None = Field(
        None, min_length=1, description="the prompt the caller rendered"
    )
    max_tokens: int = Field(ge=1)
    temperature: float = Field(ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    stop_token_ids: list[int] = Field(default_factory=list)  # beside the end-of-turn markers
    # OpenAI's function definitions: shown to a model whose chat template has a tool format,
    # its calls parsed out of its text (runners/doors/tool_calls.py).
    tools: list[dict[str, Any]] | None = None
    # The answer carries the prompt's and each choice's token ids, and then a logprob for
    # every token id (the text's view leaves out special tokens and those past a stop string).
    token_ids: bool = False
    n: int = Field(1, ge=1)
    stop: list[str] = Field(default_factory=list)
    logprobs: bool = False
    seed: int | None = None
    stream: bool = False
    deadline: float | None = Field(None, description="epoch seconds; sampling stops there")
    # vLLM's: no stop (end of turn, stop string) before `min_tokens` tokens; `ignore_eos`:
    # the end of turn does not stop (local backend only).
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False

    @model_validator(mode="after")
    def _one_prompt(self) -> ChatJob:
        if bool(self.messages) == (self.prompt_ids is not None):
            raise ValueError("give messages or prompt_ids (one of them)")
        return self


class WarmJob(_Frozen):
    """Load a model into the worker ahead of the first request."""

    op: Literal["warm"] = "warm"
    model: str
    backend: Literal["local", "tinker"] = "local"


WorkerJob = InferenceJob | ChatJob | WarmJob
