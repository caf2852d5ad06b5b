"""A tool: its name, arguments (a pydantic model), answer model and the coroutine behind it;
and how an answer becomes a tool result (structured JSON plus a short text)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp import types
from pydantic import BaseModel

from server.container import Services
from server.mcp.progress import Progress

# A tool's coroutine: its answer model (the REST route's), or a finished CallToolResult.
Run = Callable[["Call", Any], Awaitable[BaseModel]]


@dataclass(frozen=True)
class Call:
    """What a tool call may use: the services (the REST routes' code paths) and progress."""

    svc: Services
    progress: Progress


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args: type[BaseModel]
    run: Run
    out: type[BaseModel] | None = None
    text: Callable[[dict[str, Any]], str] = lambda _data: "Done."
    read_only: bool = True
    destructive: bool = False

    def tool(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            description=self.description,
            inputSchema=self.args.model_json_schema(),
            outputSchema=self.out.model_json_schema(mode="serialization") if self.out else None,
            annotations=types.ToolAnnotations(
                readOnlyHint=self.read_only,
                destructiveHint=self.destructive,
                openWorldHint=False,
            ),
        )

    def result(self, answer: BaseModel) -> types.CallToolResult:
        if isinstance(answer, types.CallToolResult):
            return answer
        if self.out is not None:  # the answer as the REST route's model (the output schema)
            answer = self.out.model_validate(answer)
        data = answer.model_dump(mode="json", by_alias=True)
        return types.CallToolResult(
            content=[
                types.TextContent(type="text", text=self.text(data)),
                types.TextContent(type="text", text=json.dumps(data, indent=2)),
            ],
            structuredContent=data,
        )


def error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], isError=True
    )
