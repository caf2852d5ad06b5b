"""A loopback proxy in front of a live server that passes every request on and, for the
endpoints told, drops the answer of the first one (the server did the work; the client sees
a 503 and sends the request again): what a lost response looks like to the SDK. It keeps
every exchange it passed on, for tests that read what the SDK was answered."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx

from tests.support.standins.loopback import LoopbackServer

HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


@dataclass(frozen=True)
class Exchange:
    """One request passed on and the answer its client saw."""

    method: str
    path: str
    body: bytes
    status: int
    content_type: str
    answer: bytes


class FaultProxy(LoopbackServer):
    thread_name = "fault proxy"

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream
        self._client = httpx.Client(base_url=upstream, timeout=60)
        self._lock = threading.Lock()
        self._drop: dict[str, int] = {}
        self.dropped: list[tuple[str, bytes]] = []  # (path, the answer the client never saw)
        self.passed: list[tuple[str, bytes]] = []
        self.exchanges: list[Exchange] = []  # every request passed on and its answer, in order

    def drop_next(self, path: str, count: int = 1) -> None:
        with self._lock:
            self._drop[path] = count

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_HEADERS}
        answer = self._client.request(method, handler.path, content=body, headers=headers)
        with self._lock:
            drop = self._drop.get(handler.path, 0) > 0
            if drop:
                self._drop[handler.path] -= 1
                self.dropped.append((handler.path, answer.content))
            else:
                self.passed.append((handler.path, answer.content))
                kind = answer.headers.get("content-type", "")
                self.exchanges.append(
                    Exchange(method, handler.path, body, answer.status_code, kind, answer.content)
                )
        status, content = (
            (503, b'{"detail": "injected: answer lost"}')
            if drop
            else (
                answer.status_code,
                answer.content,
            )
        )
        handler.send_response(status)
        kind = "application/json" if drop else answer.headers.get("content-type", "")
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)

    def _before_stop(self) -> None:
        self._client.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        self.server.standin._handle(self, "POST")  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        self.server.standin._handle(self, "GET")  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        pass


FaultProxy.handler_class = _Handler
