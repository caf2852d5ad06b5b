"""`/mcp`: the SDK's streamable HTTP session manager behind our bearer-token check (a mounted
ASGI app is outside the routers' dependencies). The host, origin and loopback checks are the
app's middlewares, which see every path. One manager per app lifespan (a manager runs once)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from server.container import Services
from server.errors import DomainError, status_for
from server.guards.access import require_token
from server.mcp.server import build_server


class McpEndpoint:
    """ASGI app for the `/mcp` route: 401/403 before any MCP handling, then the manager."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            require_token(Request(scope))
        except DomainError as exc:
            status = status_for(exc)
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            reply = JSONResponse({"detail": exc.detail}, status_code=status, headers=headers)
            await reply(scope, receive, send)
            return
        manager: StreamableHTTPSessionManager | None = getattr(scope["app"].state, "mcp", None)
        if manager is None:  # between the app's shutdown and its end
            await JSONResponse({"detail": "The server is stopping."}, status_code=503)(
                scope, receive, send
            )
            return
        await manager.handle_request(scope, receive, send)


@asynccontextmanager
async def serve_mcp(app: FastAPI, svc: Services) -> AsyncIterator[None]:
    """Run the MCP sessions for the app's lifetime; they end (cancelled) before the services."""
    manager = StreamableHTTPSessionManager(build_server(svc))
    async with manager.run():
        app.state.mcp = manager
        try:
            yield
        finally:
            app.state.mcp = None
