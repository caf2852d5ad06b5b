"""Who may call the server: loopback clients only unless a token is set (DESIGN §10).

However the server is started (`python -m server`, `uvicorn server.app:app --host 0.0.0.0`,
Docker), a request from another machine is refused when no RLCS_API_TOKEN is configured,
unless the operator opted out with RLCS_INSECURE_NO_TOKEN=1.
"""

from __future__ import annotations

import base64
import binascii
import secrets

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from core.net import is_loopback, parse_ip
from core.settings import Settings
from server.errors import Forbidden, Unauthorized
from server.guards.web import SAFE_METHODS, send_error


def remote_peer(host: str | None) -> bool:
    """True for an IP address off this machine. Peers without an IP (a unix socket, an
    in-process test client) and loopback addresses, IPv4-mapped ones included, are local."""
    return parse_ip(host) is not None and not is_loopback(host)


class LoopbackUnlessToken:
    """ASGI middleware: refuse remote peers (403, saying how to fix it) while no token is set."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.open_to_all = settings.api_token is not None or settings.insecure_no_token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.open_to_all or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        host = client[0] if client else None
        if not remote_peer(host):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send_error(scope, receive, send, 403, refusal(host))


def refusal(host: str | None) -> str:
    return (
        f"This server has no API token, so it answers clients on its own machine only (you "
        f"connected from {host}). Set RLCS_API_TOKEN=<secret> where the server runs and send "
        "'Authorization: Bearer <secret>' (clients that cannot send headers may put it in the "
        "URL: http://rlcs:<secret>@host:port), or connect through 127.0.0.1. "
        "RLCS_INSECURE_NO_TOKEN=1 turns this check off."
    )


def token_matches(header: str, token: str) -> bool:
    """`Bearer <token>`, or HTTP basic auth with the token as password (any user name): the
    form a client sends for a URL like http://rlcs:<token>@host:8080."""
    scheme, _, given = header.partition(" ")
    scheme = scheme.lower()
    if scheme == "basic":
        given = _basic_password(given.strip())
    elif scheme != "bearer":
        return False
    return secrets.compare_digest(given.strip().encode(), token.encode())


def _basic_password(credentials: str) -> str:
    try:
        decoded = base64.b64decode(credentials, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""
    return decoded.partition(":")[2]


def insecure_warning() -> str:
    return (
        "RLCS_INSECURE_NO_TOKEN=1: this server answers ANY client that can reach it, with no "
        "token. Anyone on the network can start runs and read results. Set RLCS_API_TOKEN "
        "instead unless a firewall or a 127.0.0.1-only port mapping keeps others out."
    )


def require_token(request: Request) -> None:
    """The bearer-token check protected routes depend on: the admin token may do anything;
    read tokens may list and watch."""
    settings = request.app.state.settings
    token = settings.api_token
    if token is None:
        return
    given = request.headers.get("authorization", "")
    if token_matches(given, token.get_secret_value()):
        return
    # Every read token is compared (no early exit), each in constant time.
    read_only = [token_matches(given, t) for t in settings.read_token_values]
    if not any(read_only):
        raise Unauthorized(
            "Missing or wrong token: send the header 'Authorization: Bearer <RLCS_API_TOKEN>'."
        )
    if request.method not in SAFE_METHODS:
        raise Forbidden(
            f"This token is read-only (scope: read): it may list and watch runs but not "
            f"{request.method} {request.url.path} (start, stop, resume, select, edit or "
            "inference). Send the admin token, RLCS_API_TOKEN, for that."
        )
