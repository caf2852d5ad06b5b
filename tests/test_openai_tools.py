"""Tools on /v1 (docs/openai.md): shown to a model whose chat template has Hermes's tool format
and its calls parsed into OpenAI's tool_calls (in the engine host's chat job, with a scripted
sampler); what cannot be served refused with a 400 naming the field."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.spec import ChatJob, ChatMessage
from runners.engine_host.chat import ChatCompletion
from runners.models.tiny import build_tiny_tokenizer
from server.app import create_app
from tests.support.scripted_sampler import HERMES_TEMPLATE, Scripted
from tests.support.settings import make_settings

TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def job(**fields: Any) -> ChatJob:
    return ChatJob(
        model="hermes-like",
        backend="tinker",  # no local-only options: the scripted sampler takes the SDK's call
        max_tokens=64,
        temperature=1.0,
        **fields,
    )


def test_a_call_comes_back_as_tool_calls_and_earlier_ones_are_shown_back() -> None:
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = HERMES_TEMPLATE
    said = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    sampler = Scripted(tokenizer, said)
    earlier = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Bergen"}'},
    }
    messages = [
        ChatMessage(role="user", content="Weather in Bergen, then Oslo?"),
        ChatMessage(role="assistant", content="", tool_calls=[earlier]),
        ChatMessage(role="tool", content="rain", tool_call_id="call_0"),
    ]
    answer = asyncio.run(
        ChatCompletion(job(messages=messages, tools=[TOOL]), sampler, tokenizer).run()
    )
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["text"] is None
    (call,) = choice["tool_calls"]
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    shown = sampler.prompts[-1]
    assert '"name": "weather"' in shown and '"arguments": {"city": "Bergen"}' in shown
    assert "<|im_start|>tool\nrain" in shown


def test_a_model_without_a_tool_format_is_refused_naming_tools() -> None:
    tokenizer = build_tiny_tokenizer()
    sampler = Scripted(tokenizer, "hi")
    messages = [ChatMessage(role="user", content="Hi")]
    with pytest.raises(ValueError, match="^tools: this model's chat template has no tool format"):
        asyncio.run(ChatCompletion(job(messages=messages, tools=[TOOL]), sampler, tokenizer).run())
    assert sampler.prompts == []  # nothing sampled


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(tmp_path))) as test_client:
        yield test_client


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stream": True}, "leave out stream"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "rain"}]}, "tool_call_id"),
        ({"messages": [{"role": "user", "content": None}]}, "content"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_it(
    client: TestClient, extra: dict[str, Any], param: str
) -> None:
    body = {
        "model": "tiny-random",
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [TOOL],
    }
    answer = client.post("/v1/chat/completions", json={**body, **extra})
    assert answer.status_code == 400, answer.text
    assert param in answer.json()["error"]["message"], answer.text
