"""Loopback stand-in for the W&B GraphQL API, as read by the real `wandb.Api` (wandb 0.31)
and written by the real `wandb.init` online (the write side is in `wandb_writes`).

Runs live in memory; latency and HTTP faults (429/5xx with Retry-After) can be injected, and
every GraphQL request is recorded by operation name (never with the API key).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.standins.loopback import LoopbackServer
from tests.support.standins.wandb_writes import (
    FILE_STREAM_ANSWER,
    FILE_STREAM_RE,
    UPLOAD_PREFIX,
    WRITE_OPERATIONS,
    StandinError,
    WriteSide,
    storage_id,
)

GRAPHQL_PATH = "/graphql"
# wandb-core posts its own OpenTelemetry metrics to the same base URL; they are accepted and
# counted apart, so they never show up as GraphQL traffic.
TELEMETRY_PREFIX = "/sdk/otel/"

VIEWER_OPERATIONS = frozenset({"Viewer", "GetViewer", "GetDefaultEntity"})
RUN_OPERATIONS = frozenset({"Run", "RunState"})

_OPERATION_RE = re.compile(r"\b(query|mutation)\s+([A-Za-z_]\w*)")


@dataclass
class RecordedRequest:
    """One GraphQL request as the stand-in received it, with the status it answered."""

    index: int
    operation: str
    variables: dict[str, Any]
    at: float  # time.monotonic() when it arrived
    authorized: bool  # whether it carried the expected key (the key itself is not kept)
    status: int | None = None  # None while the answer is still being delayed
    fault: bool = False  # answered by an injected fault


@dataclass
class StandinRun:
    """A run as the W&B backend would hold it: summary, history rows and state, and what the
    real client wrote besides (config from UpsertBucket, uploaded files, rewinds)."""

    entity: str
    project: str
    run_id: str
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    state: str = "running"
    display_name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    created_at: str = "2025-01-01T00:00:00"
    heartbeat_at: str = "2025-01-01T00:00:00"
    tags: list[str] = field(default_factory=list)
    exitcode: int | None = None  # from the file_stream's final post
    rewinds: list[float] = field(default_factory=list)  # the _step of each RewindRun
    files: dict[str, bytes] = field(default_factory=dict)  # uploaded through CreateRunFiles
    uploaded: list[str] = field(default_factory=list)  # names file_stream reported uploaded

    def node(self, username: str) -> dict[str, Any]:
        """The run as the GraphQL `Run` type with the fields of wandb's RunFragment."""
        keys: dict[str, Any] = {}
        for row in self.history:
            for key in row:
                entry = keys.setdefault(key, {"typeCounts": [{"type": "number", "count": 0}]})
                entry["typeCounts"][0]["count"] += 1
        last_step = self.history[-1].get("_step") if self.history else None
        return {
            "id": storage_id(self.entity, self.project, self.run_id),
            "projectId": "1",
            "name": self.run_id,
            "displayName": self.display_name or self.run_id,
            "state": self.state,
            "tags": list(self.tags),
            "sweepName": None,
            "group": None,
            "jobType": None,
            "commit": None,
            "readOnly": False,
            "createdAt": self.created_at,
            "heartbeatAt": self.heartbeat_at,
            "description": None,
            "notes": None,
            # JSON-encoded strings on the wire, as the real backend sends them.
            "config": json.dumps({k: {"value": v, "desc": None} for k, v in self.config.items()}),
            "systemMetrics": "{}",
            "summaryMetrics": json.dumps(self.summary),
            "historyLineCount": len(self.history),
            "historyKeys": {"keys": keys, "lastStep": last_step},
            "user": {"name": username, "username": username},
        }

    def sampled(self, keys: list[str], samples: int) -> list[dict[str, Any]]:
        """Rows holding every requested key, cut down to those keys, at most `samples` of them
        (evenly spaced, first and last kept)."""
        rows = [{k: row[k] for k in keys} for row in self.history if all(k in row for k in keys)]
        if samples <= 0 or len(rows) <= samples:
            return rows
        if samples == 1:
            return [rows[-1]]
        step = (len(rows) - 1) / (samples - 1)
        return [rows[round(i * step)] for i in range(samples)]


@dataclass
class _Fault:
    status: int
    remaining: int
    retry_after_s: float | None
    message: str


class WandbStandin(WriteSide, LoopbackServer):
    """A W&B GraphQL endpoint on 127.0.0.1 (free port); use as a context manager.

    Point the real client at it with
    `wandb.Api(overrides={"base_url": standin.url}, api_key=KEY, timeout=...)`, or write to it
    with `wandb.init(mode="online")` and WANDB_BASE_URL=standin.url, WANDB_API_KEY=KEY.
    """

    def __init__(
        self,
        *,
        expected_api_key: str | None = None,
        entity: str = "standin-entity",
        username: str = "standin-user",
    ) -> None:
        super().__init__()
        self.expected_api_key = expected_api_key
        self.entity = entity
        self.username = username
        self.delay_s = 0.0  # every GraphQL answer waits this long (slow W&B)
        self.requests: list[RecordedRequest] = []
        self.telemetry_posts = 0
        self._runs: dict[tuple[str, str, str], StandinRun] = {}
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        # Notified on every write, so tests wait for what the client sent instead of sleeping.
        self._changed = threading.Condition(self._lock)
        self._closing = threading.Event()
        self._init_write_side()

    def _before_stop(self) -> None:
        self._closing.set()  # wakes handlers sleeping in a delay

    # Runs ------------------------------------------------------------------------------

    def add_run(
        self,
        entity: str,
        project: str,
        run_id: str,
        summary: dict[str, Any] | None = None,
        history: list[dict[str, Any]] | None = None,
        state: str = "running",
        display_name: str | None = None,
    ) -> StandinRun:
        run = StandinRun(
            entity=entity,
            project=project,
            run_id=run_id,
            summary=copy.deepcopy(summary or {}),
            history=copy.deepcopy(history or []),
            state=state,
            display_name=display_name,
        )
        with self._changed:
            self._runs[(entity, project, run_id)] = run
            self._changed.notify_all()
        return run

    def update_run(
        self,
        entity: str,
        project: str,
        run_id: str,
        *,
        summary: dict[str, Any] | None = None,
        state: str | None = None,
        history: list[dict[str, Any]] | None = None,
    ) -> StandinRun:
        """Merge `summary` into the run's summary, set its state, append history rows."""
        with self._changed:
            run = self._runs[(entity, project, run_id)]
            if summary:
                run.summary.update(copy.deepcopy(summary))
            if state is not None:
                run.state = state
            if history:
                run.history.extend(copy.deepcopy(history))
            self._changed.notify_all()
        return run

    def log(self, entity: str, project: str, run_id: str, row: dict[str, Any]) -> None:
        """What `wandb.log(row, step=...)` does server-side: a history row and a new summary."""
        with self._changed:
            run = self._runs[(entity, project, run_id)]
            run.history.append(copy.deepcopy(row))
            run.summary.update(copy.deepcopy(row))
            self._changed.notify_all()

    def remove_run(self, entity: str, project: str, run_id: str) -> None:
        with self._lock:
            self._runs.pop((entity, project, run_id), None)

    def run(self, entity: str, project: str, run_id: str) -> StandinRun:
        """A copy of the run as it stands now (KeyError if the stand-in holds none)."""
        with self._lock:
            return copy.deepcopy(self._runs[(entity, project, run_id)])

    def _new_run(self, entity: str, project: str, run_id: str) -> StandinRun:
        return StandinRun(entity=entity, project=project, run_id=run_id, summary={}, history=[])

    # Faults and the request log ----------------------------------------------------------

    def fail_next(
        self,
        count: int = 1,
        status: int = 429,
        retry_after_s: float | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next `count` GraphQL requests with `status` (and Retry-After if given)."""
        default = "rate limit exceeded" if status == 429 else "service unavailable"
        with self._lock:
            self._faults.append(_Fault(status, count, retry_after_s, message or default))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def operations(self) -> list[str]:
        with self._lock:
            return [r.operation for r in self.requests]

    def reset_log(self) -> None:
        with self._lock:
            self.requests.clear()

    def wait_for_requests(self, count: int, timeout_s: float = 10.0) -> bool:
        """Block until at least `count` GraphQL requests arrived (True) or time ran out."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.requests) >= count, timeout_s)

    def wait_answered(self, timeout_s: float = 10.0) -> bool:
        """Block until every GraphQL request that arrived has been answered (True)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: all(r.status is not None for r in self.requests), timeout_s
            )

    # Request handling (called from handler threads) --------------------------------------

    def _authorized(self, header: str | None) -> bool:
        if self.expected_api_key is None:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            decoded = base64.b64decode(header[6:], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        # The client sends HTTP basic auth with user "api" and the key as password.
        return decoded == f"api:{self.expected_api_key}"

    def _take_fault(self) -> _Fault | None:
        with self._lock:
            while self._faults and self._faults[0].remaining <= 0:
                self._faults.pop(0)
            if not self._faults:
                return None
            fault = self._faults[0]
            fault.remaining -= 1
            return fault

    def _record(
        self, operation: str, variables: dict[str, Any], authorized: bool
    ) -> RecordedRequest:
        with self._lock:
            request = RecordedRequest(
                index=len(self.requests),
                operation=operation,
                variables=variables,
                at=time.monotonic(),
                authorized=authorized,
            )
            self.requests.append(request)
            self._changed.notify_all()
        return request

    def _answered(self, request: RecordedRequest, status: int, fault: bool = False) -> None:
        with self._changed:
            request.status, request.fault = status, fault
            self._changed.notify_all()

    def handle_graphql(
        self, body: dict[str, Any], auth_header: str | None
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        query = str(body.get("query") or "")
        match = _OPERATION_RE.search(query)
        operation = body.get("operationName") or (match.group(2) if match else "anonymous")
        variables = body.get("variables") or {}
        # Recorded on arrival, so a request still sleeping out `delay_s` is already counted.
        request = self._record(operation, variables, self._authorized(auth_header))
        if self.delay_s > 0:
            self._closing.wait(self.delay_s)
        fault = self._take_fault()
        if fault is not None:
            self._answered(request, fault.status, fault=True)
            headers = {}
            if fault.retry_after_s is not None:
                headers["Retry-After"] = f"{fault.retry_after_s:g}"
            return fault.status, _errors(fault.message), headers
        if not request.authorized:
            self._answered(request, 401)
            return 401, _errors("user is not logged in"), {}
        try:
            data = self._answer(operation, query, variables)
        except StandinError as exc:
            self._answered(request, exc.status)
            return exc.status, _errors(exc.message), {}
        self._answered(request, 200)
        return 200, {"data": data}, {}

    def _answer(self, operation: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        if operation in VIEWER_OPERATIONS:
            return {"viewer": self._viewer()}
        if operation in WRITE_OPERATIONS:
            return self._answer_write(operation, variables)
        if operation in RUN_OPERATIONS:
            return {"project": self._project(variables, lambda run: run.node(self.username))}
        if operation == "RunSampledHistory":
            specs = [json.loads(spec) for spec in variables.get("specs") or []]
            return {
                "project": self._project(
                    variables,
                    lambda run: {
                        "sampledHistory": [
                            run.sampled(list(spec.get("keys") or []), int(spec.get("samples", 500)))
                            for spec in specs
                        ]
                    },
                )
            }
        if operation == "RunFullHistory":
            samples = int(variables.get("samples") or 500)
            node = "events" if re.search(r"\bevents\s*\(", query) else "history"

            def full(run: StandinRun) -> dict[str, Any]:
                rows = [] if node == "events" else run.history[-samples:]
                return {node: [json.dumps(row) for row in rows]}

            return {"project": self._project(variables, full)}
        raise StandinError(400, f"the W&B stand-in does not implement operation {operation!r}")

    def _viewer(self) -> dict[str, Any]:
        return {
            "id": "VXNlcjox",
            "name": self.username,
            "username": self.username,
            "email": f"{self.username}@example.invalid",
            "admin": False,
            "entity": self.entity,
            "flags": "{}",
            "deletedAt": None,
            "apiKeys": {"edges": []},
            "teams": {"edges": [{"node": {"name": self.entity}}]},
        }

    def _project(self, variables: dict[str, Any], shape: Any) -> dict[str, Any] | None:
        key = (
            str(variables.get("entity")),
            str(variables.get("project")),
            str(variables.get("name")),
        )
        with self._lock:
            known = any(k[:2] == key[:2] for k in self._runs)
            run = self._runs.get(key)
            # A project that holds no run at all answers null, like a missing project does.
            if not known:
                return None
            return {"run": shape(run) if run is not None else None}


def _errors(message: str) -> dict[str, Any]:
    return {"errors": [{"message": message}], "data": None}


class _Handler(BaseHTTPRequestHandler):
    standin: WandbStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: tests read `standin.requests` instead

    def do_POST(self) -> None:
        raw = self._read_body()
        path = self.path.split("?", 1)[0]
        standin = self.server.standin
        if path.startswith(TELEMETRY_PREFIX):
            with standin._lock:
                standin.telemetry_posts += 1
            self._send(200, b"", "application/x-protobuf", {})
            return
        stream = FILE_STREAM_RE.match(path)
        if stream is not None:
            if not standin._authorized(self.headers.get("Authorization")):
                self._send(401, json.dumps(_errors("user is not logged in")).encode(), None, {})
                return
            encoding = self.headers.get("Content-Encoding")
            status = standin.handle_file_stream(*stream.groups(), raw, encoding)
            answer = FILE_STREAM_ANSWER if status == 200 else _errors(f"file_stream {status}")
            self._send(status, json.dumps(answer).encode(), None, {})
            return
        if path != GRAPHQL_PATH:
            self._send(404, json.dumps(_errors(f"no route {path}")).encode(), None, {})
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(400, json.dumps(_errors("body is not JSON")).encode(), None, {})
            return
        status, payload, headers = self.server.standin.handle_graphql(
            body, self.headers.get("Authorization")
        )
        self._send(status, json.dumps(payload).encode(), None, headers)

    def do_PUT(self) -> None:
        # Upload URLs work without the API key, like presigned storage URLs.
        raw = self._read_body()
        path = self.path.split("?", 1)[0]
        status = 404
        if path.startswith(UPLOAD_PREFIX):
            status = self.server.standin.handle_upload(path, raw)
        self._send(status, b"", "text/plain", {})

    def do_GET(self) -> None:
        self._send(404, json.dumps(_errors("GET is not served")).encode(), None, {})

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()  # the blank line after the last chunk
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # CRLF after each chunk
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(
        self, status: int, body: bytes, content_type: str | None, headers: dict[str, str]
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type or "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout); nothing to answer


WandbStandin.handler_class = _Handler
WandbStandin.thread_name = "W&B stand-in"
