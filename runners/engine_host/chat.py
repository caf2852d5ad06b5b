"""Chat completions in the engine host: messages through the model's chat template, `n`
samples, stop strings, per-token logprobs, and (local backend, `stream`) new text as decoded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from tinker import types

from core.spec import ChatJob, ChatMessage
from runners.doors.tool_calls import knows_tools, parse_reply, template_messages
from runners.episodes.policy import bounded
from runners.episodes.render import Renderer

Emit = Callable[[int, str], None]  # a choice's index, its new text
TINKER_MARGIN_S = 5.0  # a hosted call may take this long past the budget before it is an error


def prompt_tokens(
    tokenizer: Any, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The conversation as the model was trained to read it, ending where its turn starts;
    `tools` shown as its chat template shows them (ValueError naming `tools` where the template
    has no tool format)."""
    turns = [m.model_dump(exclude_none=True) for m in messages]
    if tools:
        if not knows_tools(tokenizer):
            raise ValueError(
                "tools: this model's chat template has no tool format this server can parse "
                "calls from (Hermes's <tool_call>, as Qwen's and Hermes's templates write "
                "them); leave tools out"
            )
        text = tokenizer.apply_chat_template(
            template_messages(turns), tools=tools, tokenize=False, add_generation_prompt=True
        )
    elif getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    else:  # a base model without a template: one line per turn, then the assistant's cue
        text = "".join(f"{t['role']}: {t['content']}\n" for t in turns) + "assistant:"
    return list(tokenizer.encode(text, add_special_tokens=False))


def first_stop(text: str, stops: list[str]) -> int | None:
    """Where the earliest stop string starts in `text`, if one occurs."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


class TextStream:
    """One choice's text as its tokens arrive: hands out only text that cannot change, i.e.
    not a half-decoded character, nor the start of what may become a stop string."""

    def __init__(self, decode: Callable[[list[int]], str], stops: list[str]) -> None:
        self._decode = decode
        self._stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._tokens: list[int] = []
        self.sent = ""
        self.stopped = False

    def push(self, token: int) -> None:
        self._tokens.append(token)

    def take(self) -> str:
        if self.stopped:
            return ""
        text = self._decode(self._tokens)
        cut = first_stop(text, self._stops)
        if cut is not None:
            text, self.stopped = text[:cut], True
        else:
            text = text.rstrip("\ufffd")  # bytes of a character still to come
            text = text[: max(0, len(text) - self._hold)]
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta


class ChatCompletion:
    """Answers one ChatJob with a sampler (local or Tinker) and the model's tokenizer."""

    def __init__(self, job: ChatJob, sampler: Any, tokenizer: Any) -> None:
        self.job = job
        self._sampler = sampler
        self._tokenizer = tokenizer
        self._special = set(getattr(tokenizer, "all_special_ids", []) or [])

    def decode(self, tokens: list[int]) -> str:
        return self._tokenizer.decode(tokens, skip_special_tokens=True)

    def sampling_params(self) -> types.SamplingParams:
        job = self.job
        # With ignore_eos the end-of-turn markers are not stops either (they are the chat's
        # end of sequence); the sampler then also leaves out the model's EOS ids.
        markers = [] if job.ignore_eos else Renderer(self._tokenizer).stop_token_ids()
        markers = markers + [t for t in job.stop_token_ids if t not in markers]
        stop: list[str] | list[int] = markers
        if job.stop:
            # One list cannot mix ids and strings: the end-of-turn markers go in as text.
            stop = list(job.stop) + [
                self._tokenizer.decode([m], skip_special_tokens=False) for m in markers
            ]
        return types.SamplingParams(
            max_tokens=job.max_tokens,
            temperature=job.temperature,
            top_p=job.top_p,
            top_k=job.top_k,
            stop=stop,
            seed=job.seed,
        )

    async def run(self, cancel: Any = None, emit: Emit | None = None) -> dict[str, Any]:
        job = self.job
        started = time.monotonic()
        prompt = (
            job.prompt_ids
            if job.prompt_ids is not None
            else prompt_tokens(self._tokenizer, job.messages, job.tools)
        )
        deadline = None
        if job.deadline is not None:  # the server stamps wall-clock time; engines use monotonic
            deadline = time.monotonic() + (job.deadline - time.time())
        call_args: dict[str, Any] = dict(
            prompt=types.ModelInput.from_ints(prompt),
            num_samples=job.n,
            sampling_params=self.sampling_params(),
        )
        response = await self._sample(call_args, deadline, cancel, emit)
        choices = [self._choice(i, seq) for i, seq in enumerate(response.sequences)]
        answer = {
            "ok": True,
            "model": job.model,
            "backend": job.backend,
            "prompt_tokens": len(prompt),
            "choices": choices,
            "latency_s": round(time.monotonic() - started, 3),
        }
        if job.token_ids:
            answer["prompt_token_ids"] = list(prompt)
        return answer

    async def _sample(
        self, call_args: dict[str, Any], deadline: float | None, cancel: Any, emit: Emit | None
    ) -> types.SampleResponse:
        """The sampler's answer by `deadline` (time.monotonic()): the local engine's streamed
        to `emit` when the job streams, the Tinker SDK's bounded by a timeout."""
        job = self.job
        if job.backend == "local":
            call_args.update(
                deadline=deadline,
                cancel=cancel,
                min_tokens=min(job.min_tokens, job.max_tokens),
                ignore_eos=job.ignore_eos,
            )
            streams = [TextStream(self.decode, job.stop) for _ in range(job.n)]
            if job.stream and emit is not None:
                return await self._streamed(call_args, streams, emit)
            return await self._sampler.sample(**call_args)
        # The SDK has no deadline of its own and may wait on a stuck request indefinitely.
        left = None if deadline is None else max(1.0, deadline - time.monotonic())
        timeout = None if left is None else left + TINKER_MARGIN_S
        return await bounded(self._sampler.sample(**call_args), timeout, "sample")

    async def _streamed(
        self, call_args: dict[str, Any], streams: list[TextStream], emit: Emit
    ) -> types.SampleResponse:
        """Sample with the engine telling us each token; send the text that is final so far."""
        loop = asyncio.get_running_loop()
        picked: asyncio.Queue[tuple[int, int]] = asyncio.Queue()

        def on_token(index: int, token: int, _logprob: float) -> None:
            loop.call_soon_threadsafe(picked.put_nowait, (index, token))

        pending = asyncio.ensure_future(self._sampler.sample(**call_args, on_token=on_token))
        while True:
            getter = asyncio.ensure_future(picked.get())
            await asyncio.wait({pending, getter}, return_when=asyncio.FIRST_COMPLETED)
            items = [getter.result()] if getter.done() else []
            if not getter.done():
                getter.cancel()
            while not picked.empty():
                items.append(picked.get_nowait())
            for index, token in items:
                streams[index].push(token)
            for index in sorted({index for index, _ in items}):
                delta = streams[index].take()
                if delta:
                    emit(index, delta)
            if pending.done():
                return pending.result()

    def _choice(self, index: int, sequence: Any) -> dict[str, Any]:
        tokens = [int(t) for t in sequence.tokens]
        text = self.decode(tokens)
        cut = first_stop(text, self.job.stop)
        if cut is not None:
            text = text[:cut]
        finish = "stop" if cut is not None or sequence.stop_reason == "stop" else "length"
        choice: dict[str, Any] = {
            "index": index,
            "text": text,
            "finish_reason": finish,
            "tokens": len(tokens),
            "logprobs": None,
        }
        if self.job.tools:
            reply = parse_reply(text)
            if reply.tool_calls:
                choice.update(
                    text=reply.content, tool_calls=reply.tool_calls, finish_reason="tool_calls"
                )
        if self.job.token_ids:
            choice["token_ids"] = tokens
        if self.job.logprobs:
            logprobs = sequence.logprobs
            values = list(logprobs) if logprobs is not None else [0.0] * len(tokens)
            if self.job.token_ids:
                choice["logprobs"] = [
                    self._entry(t, lp) for t, lp in zip(tokens, values, strict=True)
                ]
            else:
                choice["logprobs"] = self._logprobs(tokens, values, cut)
        return choice

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        text = self._tokenizer.decode([token], skip_special_tokens=False)
        return {
            "token": text,
            "logprob": float(logprob),
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": [],
        }

    def _logprobs(
        self, tokens: list[int], values: list[float], cut: int | None
    ) -> list[dict[str, Any]]:
        """OpenAI's per-token entries for the tokens of the text returned (an end-of-turn
        marker and tokens after a stop string are not part of it)."""
        entries = []
        for k, (token, logprob) in enumerate(zip(tokens, values, strict=True)):
            if token in self._special:
                continue
            if cut is not None and len(self.decode(tokens[:k])) >= cut:
                break
            entries.append(self._entry(token, logprob))
        return entries
