"""No way in from a web page: a Host allowlist (DNS rebinding), cross-site refusal of every
state-changing request, JSON-only bodies, and a cap on body size; each refusal says the fix."""

from __future__ import annotations

from email.message import Message

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from core.settings import Settings

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The Tinker SDK's API (server.tinker_api): larger bodies, and one that is protobuf.
TINKER_PREFIX = "/api/v1/"
PROTOBUF_PATHS = frozenset({"/api/v1/forward_backward"})


async def send_error(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
    """Answer with our error body ({"detail": ...}) from inside a middleware."""
    await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)


def host_name(host_header: str) -> str:
    """`name[:port]` or `[v6]:port` -> the name, lower case, no trailing dot."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


class WebGuard:
    """ASGI middleware: Host allowlist, same-origin writes, JSON bodies (in that order)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.hosts = settings.host_allowlist()
        self.cors_origins = frozenset(o.rstrip("/").lower() for o in settings.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await send_error(scope, receive, send, *refusal)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        if self.hosts is not None and host is not None and host_name(host) not in self.hosts:
            return 400, (
                f"Host {host!r} is not one this server answers to (a guard against DNS "
                f"rebinding). Connect through 127.0.0.1 or localhost, or list the name in "
                f"RLCS_ALLOWED_HOSTS (comma-separated; allowed now: {sorted(self.hosts)})."
            )
        if scope["method"] in SAFE_METHODS:
            return None
        if not self.same_origin_or_allowed(scope, headers):
            origin = headers.get("origin", "(none)")
            return 403, (
                f"Cross-site request refused: a web page from origin {origin} may not change "
                "this server. Use the server's own dashboard, a client that sends no Origin "
                "(curl, scripts, SDKs), or allow that origin with RLCS_CORS_ORIGINS."
            )
        content_type = headers.get("content-type")
        if scope["path"] in PROTOBUF_PATHS and is_protobuf(content_type):
            return None
        if has_body(headers) and not is_json(content_type):
            return 415, (
                "Request bodies must be JSON: send 'Content-Type: application/json' "
                f"(got {headers.get('content-type', 'none')})."
            )
        return None

    def same_origin_or_allowed(self, scope: Scope, headers: Headers) -> bool:
        origin = headers.get("origin")
        site = headers.get("sec-fetch-site")
        if origin is None:
            # No Origin: a script or CLI, unless the browser says it is cross-site anyway.
            return site in (None, "same-origin", "none")
        origin = origin.rstrip("/").lower()
        if origin in self.cors_origins:
            return True
        own = f"{scope.get('scheme', 'http')}://{headers.get('host', '').lower()}"
        return origin == own and site in (None, "same-origin")


def has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in headers


def is_protobuf(content_type: str | None) -> bool:
    if not content_type:
        return False
    return content_type.split(";")[0].strip() == "application/x-protobuf"


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    parsed = Message()
    parsed["content-type"] = content_type
    kind = parsed.get_content_type()
    return kind == "application/json" or kind.endswith("+json")


class BodyTooLarge(HTTPException):
    """Raised from `receive`: an HTTPException, so FastAPI passes it on as our 413 answer
    instead of turning it into "error parsing the body"."""

    def __init__(self, limit: int, tinker: bool = False) -> None:
        setting = "RLCS_TINKER_MAX_BODY_BYTES" if tinker else "RLCS_MAX_BODY_BYTES"
        super().__init__(
            413,
            f"Request body too large: the limit is {limit} bytes ({setting}). Send "
            "fewer or shorter prompts, or raise the limit where the server runs.",
        )


class BodyLimit:
    """ASGI middleware: 413 for a body over `max_body_bytes`, declared or streamed."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.default_limit = settings.max_body_bytes
        self.tinker_limit = settings.tinker_max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tinker = scope["path"].startswith(TINKER_PREFIX)
        limit = self.tinker_limit if tinker else self.default_limit
        length = Headers(scope=scope).get("content-length", "")
        if length.strip().isdigit() and int(length) > limit:
            await send_error(scope, receive, send, 413, BodyTooLarge(limit, tinker).detail)
            return
        seen = 0
        started = False

        async def counted_receive() -> AsgiMessage:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit, tinker)
            return message

        async def tracked_send(message: AsgiMessage) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await send_error(scope, receive, send, 413, exc.detail)
