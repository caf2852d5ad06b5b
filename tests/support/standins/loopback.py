"""The part every stand-in shares: an HTTP server on a free 127.0.0.1 port in a daemon thread,
started and stopped by the test (or as a context manager). Handlers reach the stand-in as
`self.server.standin`."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class LoopbackServer:
    handler_class: type[BaseHTTPRequestHandler]
    thread_name = "standin"

    def __init__(self) -> None:
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"the {self.thread_name} is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        if self._server is not None:
            return self
        server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler_class)
        # A handler still sleeping out an injected delay must not hold up shutdown.
        server.daemon_threads = True
        server.block_on_close = False
        server.standin = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name=self.thread_name, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._before_stop()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _before_stop(self) -> None:
        """A hook, e.g. to wake handlers sleeping in a delay."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler (it logs nothing) that answers with a JSON body."""

    def answer(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def serving(handler: type[BaseHTTPRequestHandler]) -> LoopbackServer:
    """A loopback server (not started yet) whose requests `handler` answers."""
    server = LoopbackServer()
    server.handler_class = handler
    return server
