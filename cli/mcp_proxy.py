"""The stdio MCP server behind `rlctl mcp`: one MCP session to `<RLCS_URL>/mcp` (the SDK's
streamable HTTP client), its tools, resources and progress passed through unchanged."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpx
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import McpError

from cli.exits import OK, ApiError, CliError, Unreachable

FALLBACK = {
    401: "missing or wrong token: set RLCS_API_TOKEN to the server's token",
    403: "refused: a read-only token cannot use MCP (set RLCS_API_TOKEN to the admin token), "
    "or the server has no token and answers its own machine only",
}
LONG_READ_S = 900.0  # a tool call may wait up to 600 s; the server pings the stream meanwhile


def run(url: str, token: str | None, timeout: float) -> int:
    try:
        anyio.run(_serve, url, token, timeout)
    except BaseException as exc:  # the SDK's task groups wrap the cause in exception groups
        error = _cli_error(url, exc)
        if error is None:
            raise
        raise error from None
    return OK


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _cli_error(url: str, exc: BaseException) -> CliError | None:
    """What went wrong upstream, as the error (and exit code) of the other commands."""
    leaves = list(_leaves(exc))
    for leaf in leaves:
        if isinstance(leaf, httpx.HTTPStatusError):
            response = leaf.response
            return ApiError(response.status_code, response.reason_phrase, _detail(response))
    for leaf in leaves:
        if isinstance(leaf, httpx.TransportError | McpError):
            return Unreachable(f"cannot use {url}/mcp: {leaf}")
    return None  # anything else (Ctrl-C, a bug) as it is


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json()["detail"])
    except Exception:  # the SDK streams responses and leaves a refused one unread
        return FALLBACK.get(response.status_code, "the server refused the MCP session")


async def _serve(url: str, token: str | None, timeout: float) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    limits = httpx.Timeout(timeout, read=LONG_READ_S)
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(headers=headers, timeout=limits))
        read, write, _ = await stack.enter_async_context(
            streamable_http_client(f"{url}/mcp", http_client=http)
        )
        upstream = await stack.enter_async_context(ClientSession(read, write))
        server = proxy(upstream, await upstream.initialize())
        stdin, stdout = await stack.enter_async_context(stdio_server())
        await server.run(stdin, stdout, server.create_initialization_options())


def proxy(upstream: ClientSession, info: types.InitializeResult) -> Server[Any, Any]:
    """A server whose every request is the upstream's answer to the same request."""
    server: Server[Any, Any] = Server(
        info.serverInfo.name, version=info.serverInfo.version, instructions=info.instructions
    )

    async def list_tools(_req: types.ListToolsRequest) -> types.ServerResult:
        return types.ServerResult(await upstream.list_tools())

    async def list_resources(_req: types.ListResourcesRequest) -> types.ServerResult:
        return types.ServerResult(await upstream.list_resources())

    async def list_templates(_req: types.ListResourceTemplatesRequest) -> types.ServerResult:
        return types.ServerResult(await upstream.list_resource_templates())

    async def read_resource(req: types.ReadResourceRequest) -> types.ServerResult:
        return types.ServerResult(await upstream.read_resource(req.params.uri))

    server.request_handlers.update(
        {
            types.ListToolsRequest: list_tools,
            types.CallToolRequest: _tool_caller(server, upstream),
            types.ListResourcesRequest: list_resources,
            types.ListResourceTemplatesRequest: list_templates,
            types.ReadResourceRequest: read_resource,
        }
    )
    return server


def _tool_caller(
    server: Server[Any, Any], upstream: ClientSession
) -> Callable[[types.CallToolRequest], Awaitable[types.ServerResult]]:
    """The handler of tool calls: the upstream's, its progress passed on to our caller."""

    async def call_tool(req: types.CallToolRequest) -> types.ServerResult:
        ctx = server.request_context
        token = ctx.meta.progressToken if ctx.meta is not None else None

        async def forward(progress: float, total: float | None, message: str | None) -> None:
            assert token is not None
            await ctx.session.send_progress_notification(
                token, progress, total, message, related_request_id=str(ctx.request_id)
            )

        result = await upstream.call_tool(
            req.params.name,
            req.params.arguments,
            progress_callback=forward if token is not None else None,
        )
        return types.ServerResult(result)

    return call_tool
