"""A chat completion as server-sent events in OpenAI's chunk format: a role chunk per choice,
content chunks as the worker decodes (local backend), a closing chunk with finish_reason
(and the choice's logprobs), optionally a usage chunk, then `data: [DONE]`."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from core.infer_wire import Partial
from server.errors import DomainError, status_for
from server.openai_compat.chat import ChatService, Prepared, usage
from server.openai_compat.errors import error_body

log = logging.getLogger(__name__)


def event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


class ChunkWriter:
    """Chunks of one completion, each carrying its id, creation time and model."""

    def __init__(self, prepared: Prepared) -> None:
        self._head = {
            "id": prepared.completion_id,
            "object": "chat.completion.chunk",
            "created": int(prepared.arrived),
            "model": prepared.target.model_id,
            "system_fingerprint": None,
        }

    def choice(
        self,
        index: int,
        delta: dict[str, Any],
        finish: str | None = None,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> str:
        lp = {"content": logprobs} if logprobs is not None else None
        return event(
            {
                **self._head,
                "choices": [
                    {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
                ],
            }
        )

    def usage(self, answer: dict[str, Any]) -> str:
        return event({**self._head, "choices": [], "usage": usage(answer).model_dump()})


async def stream(service: ChatService, prepared: Prepared) -> AsyncIterator[str]:
    """The events of one streamed completion; the worker stops decoding if the client leaves
    (the response is cancelled, which ends this generator)."""
    loop = asyncio.get_running_loop()
    partials: asyncio.Queue[Partial] = asyncio.Queue()
    abandoned = threading.Event()

    def on_partial(line: Partial) -> None:
        loop.call_soon_threadsafe(partials.put_nowait, line)

    writer = ChunkWriter(prepared)
    sent = [""] * prepared.job.n
    task = asyncio.ensure_future(asyncio.to_thread(service.run, prepared, abandoned, on_partial))
    try:
        for index in range(prepared.job.n):
            yield writer.choice(index, {"role": "assistant", "content": ""})
        while True:
            getter = asyncio.ensure_future(partials.get())
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            for line in _arrived(getter, partials):
                sent[line.index] += line.delta
                yield writer.choice(line.index, {"content": line.delta})
            if task.done():
                break
        try:
            answer = task.result()
        except DomainError as exc:
            # Mid-stream, an error is an event the client raises (the status is sent).
            yield event(error_body(exc.detail, status_for(exc), None, None).model_dump(mode="json"))
            return
        for chunk in _closing_chunks(writer, answer, sent):
            yield chunk
        if prepared.include_usage:
            yield writer.usage(answer)
        yield "data: [DONE]\n\n"
    finally:
        if not task.done():
            abandoned.set()  # the client went away: the worker stops at its next step


def _arrived(getter: asyncio.Future[Partial], partials: asyncio.Queue[Partial]) -> list[Partial]:
    """The lines the worker has sent since the last look: the awaited one if it came (else
    the wait is cancelled), then any queued behind it."""
    lines = [getter.result()] if getter.done() else []
    if not getter.done():
        getter.cancel()
    while not partials.empty():
        lines.append(partials.get_nowait())
    return lines


def _closing_chunks(writer: ChunkWriter, answer: dict[str, Any], sent: list[str]) -> Iterator[str]:
    """Per choice, the final text not streamed yet, then the chunk with its finish_reason
    (and logprobs)."""
    for choice in answer["choices"]:
        index, text = choice["index"], choice["text"]
        if text.startswith(sent[index]):
            rest = text[len(sent[index]) :]
            if rest:
                yield writer.choice(index, {"content": rest})
        else:  # a decoder that rewrote earlier text: what was sent stands
            log.warning("streamed text of choice %s diverged from the final text", index)
        yield writer.choice(index, {}, choice["finish_reason"], choice["logprobs"])
