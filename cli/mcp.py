"""`rlctl mcp`: an MCP server on stdin/stdout for hosts that launch tools as subprocesses,
proxying every call to the running server's `/mcp` (RLCS_URL, RLCS_API_TOKEN). The MCP SDK
is imported only when this command runs, so the other commands stay light."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from cli.client import Client


def serve(client: Client, _args: argparse.Namespace) -> int:
    from cli.mcp_proxy import run  # the SDK (pydantic, starlette): only for this command

    # Client.from_env read the same variable for the HTTP commands; the proxy makes its own
    # connection, an MCP session, so it needs the token itself.
    return run(client.url, os.environ.get("RLCS_API_TOKEN") or None, client.timeout)


def register(top: argparse._SubParsersAction, leaf: Callable[..., argparse.ArgumentParser]) -> None:
    leaf(
        top,
        "mcp",
        serve,
        "serve MCP on stdio (for Claude Desktop, Cursor, ...), proxying to the server's /mcp",
    )
