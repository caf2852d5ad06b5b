"""The `mcp` SDK's own client for tests: a session over streamable HTTP (`/mcp`) or over the
stdio of `python -m cli mcp`, and a tool call that collects its progress notifications."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import httpx
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from core.settings import PROJECT_ROOT

T = TypeVar("T")


@asynccontextmanager
async def http_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx.Timeout(30, read=300)
    async with (
        httpx.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def stdio_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    """`python -m cli mcp` as a host starts it: a subprocess speaking MCP on stdin/stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCS_")}
    env.update({"RLCS_URL": url, **({"RLCS_API_TOKEN": token} if token else {})})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "cli", "mcp"], env=env, cwd=str(PROJECT_ROOT)
    )
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@dataclass
class Called:
    result: types.CallToolResult
    progress: list[tuple[float, float | None, str | None]] = field(default_factory=list)

    @property
    def data(self) -> dict[str, Any]:
        assert not self.result.isError, self.text
        assert self.result.structuredContent is not None
        return self.result.structuredContent

    @property
    def text(self) -> str:
        return "\n".join(c.text for c in self.result.content if isinstance(c, types.TextContent))

    @property
    def error(self) -> str:
        assert self.result.isError, self.text
        return self.text


async def call(session: ClientSession, tool: str, /, **arguments: Any) -> Called:
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    result = await session.call_tool(tool, arguments, progress_callback=on_progress)
    return Called(result, progress)


def run_async(body: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(body)
