"""A webhook receiver on loopback: records every POST (headers and raw body) with the status
it answered, and can answer 500 to the next N deliveries, or to all until told otherwise."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.standins.loopback import LoopbackServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    status: int
    at: float  # time.monotonic() on arrival

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.body)

    @property
    def event(self) -> str:
        return self.headers.get("x-rlcs-event", "")


class WebhookReceiver(LoopbackServer):
    thread_name = "webhook-receiver"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self.fail_next = 0  # answer 500 to this many more deliveries
        self.fail_all = False

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def accepted(self) -> list[Received]:
        return [r for r in self.received if r.status == 204]

    def _answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self._lock:
            failing = self.fail_all or self.fail_next > 0
            if self.fail_next > 0:
                self.fail_next -= 1
            status = 500 if failing else 204
            self._received.append(Received(path, headers, body, status, time.monotonic()))
        return status


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        standin: WebhookReceiver = self.server.standin  # type: ignore[attr-defined]
        status = standin._answer(self.path, headers, body)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:  # quiet
        pass


WebhookReceiver.handler_class = _Handler
