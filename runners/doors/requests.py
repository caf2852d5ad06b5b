"""What an environment of another framework asks the inference face for, read leniently as
SGLang's, OpenAI's and vLLM's servers read it (unknown keys ignored), and the answers in their
shapes.

`/generate` is SGLang's native endpoint (atroposlib's SGLangServer, behind managed_server):
token ids in, used as given; per-token logprobs and the real finish reason out. `/v1/...` is
OpenAI's chat and completions shape (Atropos's `self.server.chat_completion` and `completion`;
verifiers' client, with vLLM's `return_token_ids`). `/inference/v1/generate` is vLLM's
token-in, token-out endpoint (verifiers' v1 trainers).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from tinker import types

from runners.doors.tool_calls import Reply, parse_reply


class BadRequest(ValueError):
    """The request cannot be served; the message says why (answered with a 400)."""


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request that does not say gets: the run's sampling fields and the environment's
    max_token_length."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


@dataclass(frozen=True)
class Sampling:
    """One request's sampling, as the backend takes it."""

    n: int
    params: types.SamplingParams


def stop_param(
    stop: object, stop_token_ids: object, end_ids: list[int]
) -> str | list[str] | list[int] | None:
    """SGLang's `stop` (a string, strings, or token ids as some environments pass
    `[eos_token_id]`) and `stop_token_ids`, as one backend `stop`: strings, or ids. The backend
    takes no mix; strings win then (end-of-turn ids stop anyway). Nothing given: `end_ids`."""
    items: list[object]
    if stop is None:
        items = []
    elif isinstance(stop, str | int):
        items = [stop]
    elif isinstance(stop, list):
        items = list(stop)
    else:
        raise BadRequest("stop: give a string, a list of strings, or a list of token ids")
    if isinstance(stop_token_ids, list):
        items += stop_token_ids
    strings = [s for s in items if isinstance(s, str) and s]
    ids = [int(s) for s in items if isinstance(s, int) and not isinstance(s, bool)]
    if len(strings) + len(ids) != len([s for s in items if s != ""]):
        raise BadRequest("stop: give a string, a list of strings, or a list of token ids")
    if strings:
        return strings
    if ids:
        return sorted(set(ids) | set(end_ids))
    return list(end_ids) or None


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{name}: expected a number, got {value!r}")
    if not low <= value <= high:
        raise BadRequest(f"{name}: {value} is outside [{low}, {high}]")
    return float(value)


def sampling_from(
    body: dict[str, Any],
    defaults: SamplingDefaults,
    end_ids: list[int],
    prompt_len: int,
    context: int | None,
    max_name: str,
    max_n: int,
    cap: int | None = None,
) -> Sampling:
    """The sampling a request asks for (`max_name`: max_new_tokens or max_tokens), its
    max tokens clamped to `cap` and to what the model's context leaves after the prompt."""
    n = int(_number(body, "n", 1, 1, max_n))
    wanted = body.get(max_name)
    if wanted is None and max_name == "max_tokens":
        wanted = body.get("max_completion_tokens")
    max_tokens = int(_number({max_name: wanted}, max_name, defaults.max_tokens, 1, 1 << 20))
    if cap is not None:
        max_tokens = min(max_tokens, cap)
    if context is not None:
        room = context - prompt_len
        if room < 1:
            raise BadRequest(
                f"the prompt has {prompt_len} tokens; this model's context is {context}"
            )
        max_tokens = min(max_tokens, room)
    top_k = body.get("top_k")
    seed = body.get("seed", body.get("sampling_seed"))
    params = types.SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", defaults.temperature, 0.0, 10.0),
        top_p=_number(body, "top_p", defaults.top_p, 1e-6, 1.0),
        top_k=int(top_k)
        if isinstance(top_k, int) and not isinstance(top_k, bool)
        else defaults.top_k,
        stop=stop_param(body.get("stop"), body.get("stop_token_ids"), end_ids),
        seed=int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None,
    )
    return Sampling(n=n, params=params)


def token_ids(value: object, what: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{what}: expected a non-empty list of token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise BadRequest(f"{what}: every token id must be a non-negative integer")
    return list(value)


# Answers ------------------------------------------------------------------------------------


def finish(sequence: types.SampledSequence) -> dict[str, Any]:
    """SGLang's finish_reason: what really ended the sequence."""
    if sequence.stop_reason == "stop":
        last = sequence.tokens[-1] if sequence.tokens else None
        return {"type": "stop", "matched": last}
    return {"type": "length", "length": len(sequence.tokens)}


def logprobs_of(sequence: types.SampledSequence) -> list[float]:
    if sequence.logprobs is None:
        return [0.0] * len(sequence.tokens)
    return [float(x) for x in sequence.logprobs]


def generate_answer(
    sequences: list[types.SampledSequence], prompt_len: int, decode: Any
) -> list[dict[str, Any]]:
    """SGLang's /generate answer, one object per sample."""
    out = []
    for sequence in sequences:
        tokens = list(sequence.tokens)
        out.append(
            {
                "text": decode(tokens),
                "output_ids": tokens,
                "meta_info": {
                    "id": uuid.uuid4().hex,
                    "finish_reason": finish(sequence),
                    "prompt_tokens": prompt_len,
                    "completion_tokens": len(tokens),
                    "output_token_logprobs": [
                        [lp, t, None] for lp, t in zip(logprobs_of(sequence), tokens, strict=True)
                    ],
                },
            }
        )
    return out


def vllm_generate_answer(
    sequences: list[types.SampledSequence], prompt: list[int]
) -> dict[str, Any]:
    """vLLM's /inference/v1/generate answer: per choice its token ids, a logprob for each
    named `token_id:<id>` (as renderers reads them), and the finish reason."""
    choices = []
    for index, sequence in enumerate(sequences):
        tokens = [int(t) for t in sequence.tokens]
        content = [
            {"token": f"token_id:{t}", "logprob": lp}
            for t, lp in zip(tokens, logprobs_of(sequence), strict=True)
        ]
        choices.append(
            {
                "index": index,
                "token_ids": tokens,
                "logprobs": {"content": content},
                "finish_reason": openai_finish(sequence),
            }
        )
    return {
        "request_id": f"generate-{uuid.uuid4().hex[:24]}",
        "choices": choices,
        "prompt_token_ids": list(prompt),
    }


def openai_finish(sequence: types.SampledSequence) -> str:
    return "stop" if sequence.stop_reason == "stop" else "length"


def chat_answer(
    model: str,
    sequences: list[types.SampledSequence],
    prompt_len: int,
    decode: Any,
    token_text: Any,
    with_logprobs: bool,
    prompt: list[int] | None = None,
    tools: bool = False,
) -> dict[str, Any]:
    """OpenAI's chat answer; with the `prompt` given (vLLM's `return_token_ids`), the prompt's
    and each choice's token ids too, as verifiers' trainers read them; with `tools`, the
    model's tool calls parsed out of its text (Hermes's format)."""
    choices = []
    for index, sequence in enumerate(sequences):
        text = decode(list(sequence.tokens))
        reply = parse_reply(text) if tools else Reply(text, [])
        choice: dict[str, Any] = {
            "index": index,
            "message": _assistant_message(reply),
            "finish_reason": "tool_calls" if reply.tool_calls else openai_finish(sequence),
            "logprobs": None,
        }
        if with_logprobs:
            choice["logprobs"] = _chat_logprobs(sequence, token_text)
        if prompt is not None:
            choice["token_ids"] = [int(t) for t in sequence.tokens]
        choices.append(choice)
    answer: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(sequences, prompt_len),
    }
    if prompt is not None:
        answer["prompt_token_ids"] = list(prompt)
    return answer


def _assistant_message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message


def _chat_logprobs(sequence: types.SampledSequence, token_text: Any) -> dict[str, Any]:
    """A chat choice's logprobs in OpenAI's shape: each sampled token's text and logprob."""
    return {
        "content": [
            {"token": token_text(t), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(sequence.tokens, logprobs_of(sequence), strict=True)
        ]
    }


def completion_answer(
    model: str, groups: list[tuple[list[types.SampledSequence], int]], decode: Any
) -> dict[str, Any]:
    """OpenAI's completions answer for one or more prompts, `n` choices each."""
    choices: list[dict[str, Any]] = []
    prompt_total = 0
    completion_total = 0
    for sequences, prompt_len in groups:
        prompt_total += prompt_len
        for sequence in sequences:
            completion_total += len(sequence.tokens)
            choices.append(
                {
                    "index": len(choices),
                    "text": decode(list(sequence.tokens)),
                    "finish_reason": openai_finish(sequence),
                    "logprobs": None,
                }
            )
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_total,
            "completion_tokens": completion_total,
            "total_tokens": prompt_total + completion_total,
        },
    }


def _usage(sequences: list[types.SampledSequence], prompt_len: int) -> dict[str, int]:
    completion = sum(len(s.tokens) for s in sequences)
    return {
        "prompt_tokens": prompt_len,
        "completion_tokens": completion,
        "total_tokens": prompt_len + completion,
    }


def message_text(content: object) -> str:
    """A chat message's content: a string, or OpenAI's list of parts (their text joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    if content is None:
        return ""
    raise BadRequest("messages: a message's content must be a string or a list of parts")


def chat_messages(body: dict[str, Any], tools: bool = False) -> list[dict[str, Any]]:
    """The request's messages as {role, content}; with `tools`, an assistant's `tool_calls`
    and a tool answer's `tool_call_id` and `name` kept too."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: expected a non-empty list of {role, content}")
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("messages: every message needs a role and a content")
        kept: dict[str, Any] = {
            "role": message["role"],
            "content": message_text(message.get("content")),
        }
        if tools:
            if isinstance(message.get("tool_calls"), list):
                kept["tool_calls"] = message["tool_calls"]
            kept.update({k: message[k] for k in ("tool_call_id", "name") if k in message})
        out.append(kept)
    return out


def tool_list(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's `tools` (OpenAI's function definitions), None when it sends none."""
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRequest("tools: expected a list of {type: function, function: {...}}")
    return tools
