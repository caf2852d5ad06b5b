"""Bodies of the OpenAI-compatible routes (/v1), in OpenAI's own field names and shapes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

MAX_CHOICES = 8  # `n`: each choice is decoded alongside the others in one request
MAX_STOPS = 4  # as OpenAI
MAX_TOKENS = 4096
DEFAULT_MAX_TOKENS = 512

StopText = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Text = Annotated[str, StringConstraints(max_length=64_000)]
ModelId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        description="A base model, a run id (its latest sampler checkpoint) or "
        "'<run_id>@step-N'; GET /v1/models lists them",
    ),
]


class StrictIn(BaseModel):
    # A field we do not know is refused by name rather than silently ignored: the client
    # asked for something (tools, response_format, ...) this server would not do.
    model_config = ConfigDict(extra="forbid")


class TextPart(StrictIn):
    type: Literal["text"]
    text: Text


ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_\-]{1,64}$")]


class ToolFunctionIn(StrictIn):
    name: ToolName
    description: str | None = Field(None, max_length=4096)
    parameters: dict[str, Any] | None = Field(None, description="A JSON schema")
    strict: bool | None = Field(None, description="Accepted and ignored")


class ToolIn(StrictIn):
    """OpenAI's function tool definition."""

    type: Literal["function"]
    function: ToolFunctionIn


class CalledFunction(StrictIn):
    name: ToolName
    arguments: str = Field(max_length=64_000, description="JSON text")


class ToolCallIn(StrictIn):
    """An earlier assistant turn's tool call, as OpenAI answered it."""

    id: str = Field(min_length=1, max_length=128)
    type: Literal["function"]
    function: CalledFunction


class ChatMessageIn(StrictIn):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = Field(
        None,
        description="The text, or a list of text parts (joined); images are not supported; "
        "null for an assistant turn of tool calls",
    )
    name: str | None = Field(None, max_length=64, description="Accepted and ignored")
    tool_calls: list[ToolCallIn] | None = Field(
        None, max_length=64, description="An assistant turn's tool calls"
    )
    tool_call_id: str | None = Field(
        None, max_length=128, description="A tool turn: the call it answers"
    )

    @model_validator(mode="after")
    def _complete(self) -> ChatMessageIn:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content: give the message's text (null only with tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls: only an assistant message carries them")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id: a tool message names the call it answers")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(StrictIn):
    include_usage: bool = False


class ChatCompletionIn(StrictIn):
    """OpenAI's chat completion request; `model` is a base model or a run's checkpoint."""

    model: ModelId
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="The same as max_tokens (OpenAI's newer name)"
    )
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOPS)] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20, description="Only 0 is supported")
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="Only 0")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="Only 0")
    min_tokens: int | None = Field(
        None,
        ge=0,
        le=MAX_TOKENS,
        description="vLLM's: tokens decoded before the end of turn or a stop string may end "
        "a choice (the end of turn cannot be drawn before); at most the token limit",
    )
    ignore_eos: bool | None = Field(
        None,
        description="vLLM's: the end of turn does not end a choice (stop strings still do), "
        "so each choice decodes its whole token limit unless a stop string ends it",
    )
    tools: list[ToolIn] | None = Field(
        None,
        max_length=128,
        description="Functions the model may call: for models whose chat template has "
        "Hermes's tool format (<tool_call>, as Qwen's and Hermes's); their calls come back as "
        "tool_calls. Others: a 400 naming tools",
    )
    tool_choice: Literal["auto", "none"] | None = Field(
        None, description="auto (the default with tools) or none; a forced call is not supported"
    )
    parallel_tool_calls: bool | None = Field(None, description="Accepted (calls are parsed all)")
    return_token_ids: bool | None = Field(
        None,
        description="vLLM's: the answer carries the prompt's token ids (prompt_token_ids) and "
        "each choice's (token_ids), and with logprobs an entry for every one of those ids; "
        "whole completions only",
    )
    user: str | None = Field(None, max_length=256, description="Accepted and ignored")
    store: bool | None = Field(None, description="Accepted and ignored")
    metadata: dict[str, str] | None = Field(None, description="Accepted and ignored")

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionIn:
        if self.return_token_ids and self.stream:
            raise ValueError(
                "return_token_ids is answered on whole completions here; leave out stream"
            )
        if self.tools and self.stream and self.tool_choice != "none":
            raise ValueError("tools are answered on whole completions here; leave out stream")
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise ValueError("give max_tokens or max_completion_tokens (they are the same)")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name} is not supported here; leave it out or set it to 0")
        if self.top_logprobs:
            raise ValueError("top_logprobs is not supported here; use logprobs=true alone")
        return self

    def token_limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


# Answers ---------------------------------------------------------------------------------


class ModelOut(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str = Field(description="The base model")
    parent: str | None = Field(None, description="For a run's checkpoint: the run")
    max_model_len: int | None = Field(
        None, description="vLLM's: the base model's context, prompt and completion together"
    )


class ModelListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[dict[str, Any]]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class CalledFunctionOut(BaseModel):
    name: str
    arguments: str = Field(description="JSON text")


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunctionOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCallOut] | None = Field(None, description="With tools")


class ChoiceOut(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None
    token_ids: list[int] | None = Field(None, description="With return_token_ids")


class UsageOut(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionOut(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChoiceOut]
    usage: UsageOut
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = Field(None, description="With return_token_ids")


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorOut(BaseModel):
    """OpenAI's error shape, which its clients read (the rest of the API answers {detail})."""

    error: OpenAIErrorBody
