"""Chat completions for the OpenAI-compatible endpoint: resolve the model id, hand the
conversation to the warm inference worker, answer in OpenAI's shape (whole or streamed)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from core.infer_wire import Partial
from core.settings import Settings
from core.spec import ChatJob, ChatMessage
from server.errors import InvalidValue, Unavailable
from server.inference.worker import InferenceWorker
from server.openai_compat.chat_models import ChatModels, Target, not_found
from server.openai_compat.generate import GenerateIn, GenerateOut, generate_body, job_fields
from server.openai_compat.schemas import (
    AssistantMessage,
    ChatCompletionIn,
    ChatCompletionOut,
    ChoiceLogprobs,
    ChoiceOut,
    UsageOut,
)

CLIENT_POLL_S = 0.25  # how often a request in flight checks that its client is still there


@dataclass(frozen=True)
class Prepared:
    """A checked request, ready for the worker: its job, when it arrived and its id."""

    target: Target
    job: ChatJob
    arrived: float
    completion_id: str
    include_usage: bool
    prompt_param: str = "messages"  # the field a prompt the sampler refuses came in


class ChatService:
    def __init__(self, settings: Settings, models: ChatModels, worker: InferenceWorker) -> None:
        self._settings = settings
        self.models = models
        self._worker = worker

    def prepare(self, body: ChatCompletionIn) -> Prepared:
        """Resolve the model and build the worker's job (every 4xx is raised here, before a
        stream has started)."""
        arrived = time.time()
        target = self.models.resolve(body.model)
        check_decoding_options(body, target)
        messages = [
            ChatMessage(
                role="system" if m.role == "developer" else m.role,
                content=m.text(),
                tool_calls=[c.model_dump() for c in m.tool_calls] if m.tool_calls else None,
                tool_call_id=m.tool_call_id,
            )
            for m in body.messages
        ]
        tools = body.tools if body.tools and body.tool_choice != "none" else None
        job = ChatJob(
            model=target.model,
            adapter=target.adapter,
            backend=target.backend,  # type: ignore[arg-type]
            messages=messages,
            max_tokens=body.token_limit(),
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            n=body.n or 1,
            stop=body.stops(),
            logprobs=bool(body.logprobs),
            seed=body.seed,
            stream=bool(body.stream),
            deadline=arrived + self._budget_s(),
            min_tokens=body.min_tokens or 0,
            ignore_eos=bool(body.ignore_eos),
            token_ids=bool(body.return_token_ids),
            tools=[t.model_dump(exclude_none=True) for t in tools] if tools else None,
        )
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return Prepared(target, job, arrived, f"chatcmpl-{uuid.uuid4().hex[:24]}", usage)

    def prepare_generate(self, body: GenerateIn) -> Prepared:
        """vLLM's generate as a worker job: the prompt's token ids as given (every 4xx here)."""
        arrived = time.time()
        target = self.models.resolve(body.model)
        params = body.sampling_params
        check_decoding_options(params, target, where="sampling_params.")
        job = ChatJob(
            model=target.model,
            adapter=target.adapter,
            backend=target.backend,  # type: ignore[arg-type]
            deadline=arrived + self._budget_s(),
            **job_fields(body),
        )
        return Prepared(target, job, arrived, "", False, prompt_param="token_ids")

    def run(
        self,
        prepared: Prepared,
        abandoned: threading.Event | None = None,
        on_partial: Callable[[Partial], None] | None = None,
    ) -> dict[str, Any]:
        """The worker's answer for `prepared` (blocking); a failure raises its 4xx/503."""
        budget = self._budget_s()
        answer = self._worker.request(
            prepared.job,
            self._settings.inference_timeout_s,
            queue_s=budget - (time.time() - prepared.arrived),
            abandoned=abandoned,
            on_partial=on_partial,
        )
        if not answer.get("ok"):
            raise worker_error(answer, prepared.target, prepared.prompt_param)
        return answer

    async def complete(
        self, prepared: Prepared, disconnected: Callable[[], Awaitable[bool]]
    ) -> ChatCompletionOut:
        """The whole completion; the worker stops decoding if the client goes away."""
        return completion_body(prepared, await self.answer(prepared, disconnected))

    async def generate(
        self, prepared: Prepared, disconnected: Callable[[], Awaitable[bool]]
    ) -> GenerateOut:
        return generate_body(await self.answer(prepared, disconnected))

    async def answer(
        self, prepared: Prepared, disconnected: Callable[[], Awaitable[bool]]
    ) -> dict[str, Any]:
        """The worker's whole answer; it stops decoding if the client goes away."""
        abandoned = threading.Event()
        answer = asyncio.ensure_future(asyncio.to_thread(self.run, prepared, abandoned))
        while not answer.done():
            await asyncio.wait({answer}, timeout=CLIENT_POLL_S)
            if not answer.done() and await disconnected():
                abandoned.set()
                break
        return await answer

    def _budget_s(self) -> float:
        return min(self._settings.inference_budget_s, self._settings.inference_timeout_s)


class DecodingOptions(Protocol):
    """What chat completions and vLLM's generate both carry (their bodies)."""

    min_tokens: int | None
    ignore_eos: bool | None

    def token_limit(self) -> int: ...


def check_decoding_options(body: DecodingOptions, target: Target, where: str = "") -> None:
    """vLLM's min_tokens and ignore_eos: within the token limit, and on the local backend
    only (hosted Tinker's sampler has neither). `where`: the fields' prefix in the body."""
    limit = body.token_limit()
    if body.min_tokens is not None and body.min_tokens > limit:
        raise InvalidValue(
            f"{where}min_tokens: {body.min_tokens} is more than the token limit ({limit}); "
            "give at most max_tokens (or max_completion_tokens)",
            param=f"{where}min_tokens",
        )
    if target.backend == "local":
        return
    for name in ("min_tokens", "ignore_eos"):
        if getattr(body, name):
            raise InvalidValue(
                f"{where}{name}: the {target.backend} backend that serves {target.model_id} "
                "does not support it; leave it out",
                param=f"{where}{name}",
            )


def completion_body(prepared: Prepared, answer: dict[str, Any]) -> ChatCompletionOut:
    """OpenAI's completion from the worker's answer (a JSON object: its wire format)."""
    choices = [
        ChoiceOut(
            index=c["index"],
            message=AssistantMessage(content=c["text"], tool_calls=c.get("tool_calls")),
            finish_reason=c["finish_reason"],
            logprobs=ChoiceLogprobs(content=c["logprobs"]) if c["logprobs"] is not None else None,
            token_ids=c.get("token_ids"),
        )
        for c in answer["choices"]
    ]
    return ChatCompletionOut(
        id=prepared.completion_id,
        created=int(prepared.arrived),
        model=prepared.target.model_id,
        choices=choices,
        usage=usage(answer),
        prompt_token_ids=answer.get("prompt_token_ids"),
    )


def usage(answer: dict[str, Any]) -> UsageOut:
    completion = sum(int(c["tokens"]) for c in answer["choices"])
    prompt = int(answer["prompt_tokens"])
    return UsageOut(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def worker_error(answer: dict[str, Any], target: Target, prompt_param: str) -> Exception:
    kind, error = answer.get("kind"), answer.get("error", "unknown error")
    if kind == "model":
        return not_found(target.model_id, f"its weights do not load ({error})")
    if kind == "backend":
        return Unavailable(f"the {target.backend} backend is not usable for sampling: {error}")
    if error.startswith("ValueError:"):  # the sampler refused the input (say, too long)
        reason = error.removeprefix("ValueError: ")
        if reason.startswith("tools: "):  # the model's template cannot show them
            return InvalidValue(reason, param="tools")
        return InvalidValue(f"{prompt_param}: {reason}", param=prompt_param)
    return Unavailable(f"sampling {target.model_id} failed: {error}")
