"""Tool calling in plain text, Qwen/Hermes style: tool specs in <tools></tools>, calls as
<tool_call>{"name": ..., "arguments": {...}}</tool_call>, results in <tool_response>."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

MAX_CALLS_PER_TURN = 8
_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")

EXAMPLE_CALL = '<tool_call>\n{"name": "<tool name>", "arguments": {<arguments>}}\n</tool_call>'


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class Parsed:
    """The well-formed calls of one reply, and what was wrong with the others."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.calls and not self.errors


def qwen_tool_specs(openai_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenReward's openai-format specs (flat) as the nested function specs Qwen models expect."""
    out = []
    for tool in openai_tools:
        function = {"name": tool.get("name"), "description": tool.get("description") or ""}
        if tool.get("parameters"):
            function["parameters"] = tool["parameters"]
        out.append({"type": "function", "function": function})
    return out


def tools_preamble(specs: list[dict[str, Any]], answer_by_message: bool) -> str:
    """The tool instructions that open the first observation."""
    listed = "\n".join(json.dumps(spec, ensure_ascii=False) for spec in specs)
    lines = [
        "You can call tools. Their signatures are given as JSON inside <tools></tools>:",
        f"<tools>\n{listed}\n</tools>",
        "",
        "To call a tool, write its name and a JSON object of arguments inside "
        "<tool_call></tool_call> tags:",
        EXAMPLE_CALL,
        "Each result comes back inside <tool_response></tool_response> tags.",
    ]
    if answer_by_message:
        lines.append("When you are done, reply without a tool call: that reply is your answer.")
    return "\n".join(lines)


def parse_tool_calls(text: str, known: set[str]) -> Parsed:
    """Every <tool_call> block in `text` (an unclosed last one too: generation may stop early)."""
    parsed = Parsed()
    for body in _CALL.findall(text)[:MAX_CALLS_PER_TURN]:
        call, error = _parse_one(body, known)
        if call is not None:
            parsed.calls.append(call)
        else:
            parsed.errors.append(error)
    return parsed


def tool_response(text: str) -> str:
    return f"<tool_response>\n{text}\n</tool_response>"


def _parse_one(body: str, known: set[str]) -> tuple[ToolCall | None, str]:
    body = _FENCE.sub("", body.strip())
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"the tool call is not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None, 'the tool call must be a JSON object with a "name" string'
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # some models send the arguments JSON-encoded
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, '"arguments" must be a JSON object'
    if not isinstance(arguments, dict):
        return None, '"arguments" must be a JSON object'
    name = data["name"]
    if name not in known:
        return None, f"there is no tool {name!r}; the tools are {', '.join(sorted(known))}"
    return ToolCall(name, arguments), ""
