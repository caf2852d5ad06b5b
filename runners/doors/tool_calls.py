"""Tool calls on the inference face, for the model families with a known tool format: Hermes's
(Qwen 2.5 and 3, Hermes, and any chat template that writes `<tool_call>` blocks), as vLLM's
`hermes` parser reads them. A request's `tools` go into the chat template; the model's
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks come back as OpenAI
`tool_calls`. A model whose template has no tool format answers text (the face counts it).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def knows_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template has Hermes's tool format."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "<tool_call>" in template and "tools" in template


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as Hermes templates read them: an assistant's tool calls with their
    arguments as objects (OpenAI sends them as JSON text), a tool's answer as its content."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if not calls:
            out.append(message)
            continue
        rendered = []
        for call in calls:
            function = dict(call.get("function") or {})
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments or "{}")
                except ValueError:
                    pass  # the template writes it as given
            rendered.append({**call, "function": function})
        out.append({**message, "tool_calls": rendered})
    return out


@dataclass(frozen=True)
class Reply:
    """What the model wrote, as an OpenAI assistant message: its text, and its tool calls."""

    content: str | None
    tool_calls: list[dict[str, Any]]


def parse_reply(text: str) -> Reply:
    """The model's text before its first `<tool_call>` block, and each block that holds a
    JSON object with a name as a call (others stay text, as vLLM's parser leaves them)."""
    calls = []
    for block in HERMES_CALL.findall(text):
        try:
            call = json.loads(block)
        except ValueError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    if not calls:
        return Reply(text, [])
    before = text[: text.find("<tool_call>")].strip()
    return Reply(before or None, calls)
