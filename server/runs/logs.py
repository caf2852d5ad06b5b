"""Follow a run's log: the last lines, then new lines as they come, then one final event, as
server-sent events framed by sse-starlette; each client address may hold a bounded number of
such streams open."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import AppStatus

from core.models import FINISHED, RAY_LAUNCHER, Run, RunStatus
from core.run_folder import log_lines
from server.errors import TooMany
from server.runs.service import RunService

T = TypeVar("T")
# Fields end at LF, one of the three line ends the SSE spec allows (sse-starlette's default is
# CRLF): the dashboard's reader (static/js/api.js) splits events at a blank line of LFs.
SSE_LINE_END = "\n"


class StreamSlots:
    """Open follow streams per client address, so one client cannot pin every worker."""

    def __init__(self, per_client: int) -> None:
        self.per_client = per_client
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()  # taken in the route's thread, given back in the loop

    def _take(self, client: str) -> None:
        with self._lock:
            if self._open[client] >= self.per_client:
                raise TooMany(
                    f"{self._open[client]} log streams are already open from {client} (the "
                    "limit, RLCS_MAX_STREAMS_PER_CLIENT); close one, or read "
                    "GET /runs/{id}/logs?tail=N instead."
                )
            self._open[client] += 1

    def _give_back(self, client: str) -> None:
        with self._lock:
            self._open[client] -= 1
            if self._open[client] <= 0:
                del self._open[client]

    def open(self, client: str, events: AsyncIterator[T]) -> AsyncIterator[T]:
        """Take one of `client`'s places (429 when none is left) for `events`, given back
        however the stream ends (the client gone included)."""
        self._take(client)
        return self._held(client, events)

    async def _held(self, client: str, events: AsyncIterator[T]) -> AsyncIterator[T]:
        try:
            async for event in events:
                yield event
        finally:
            self._give_back(client)


def bind_sse_to_this_loop() -> None:
    """Called as the app starts. sse-starlette 2.x (the openreward extra pins 2.3.6) ends every
    stream at shutdown through one process-wide event, bound to the first event loop that waits
    on it; an app started on another loop (each TestClient runs its own) needs a fresh one.
    sse-starlette 3 keeps one per context (its issue #140)."""
    AppStatus.should_exit_event = None


def event_stream(events: AsyncIterator[tuple[str, Any]]) -> EventSourceResponse:
    """`follow`'s events as an SSE response: `event: line` with the line as data, `event: end`
    with JSON. sse-starlette writes a bare CR inside a line as a break between two `data:`
    fields of the one event (a CR ends a field in the spec), so standard clients receive an LF
    there; a log line never holds an LF, so `data.replace("\n", "\r")` is the line exactly."""
    return EventSourceResponse(_framed(events), sep=SSE_LINE_END)


async def _framed(events: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[ServerSentEvent]:
    async for kind, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        yield ServerSentEvent(text, event=kind, sep=SSE_LINE_END)


async def follow(
    runs: RunService, run_id: str, tail: int, poll_s: float = 0.25
) -> AsyncIterator[tuple[str, Any]]:
    """Yield ("line", text) events, then ("end", {status, ...}) once the run has finished."""
    run = await asyncio.to_thread(runs.row, run_id)
    if run.launcher == RAY_LAUNCHER:
        async for event in _follow_job(runs, run_id, tail, max(poll_s, 1.0)):
            yield event
        return
    path: Path = await asyncio.to_thread(runs.log_path, run_id)
    lines, offset = await asyncio.to_thread(_tail_and_offset, path, tail)
    for line in lines:
        yield "line", line
    pending = b""
    while True:
        run = await asyncio.to_thread(runs.row, run_id)
        finished = RunStatus(run.status) in FINISHED
        chunk, offset = await asyncio.to_thread(_read_from, path, offset)
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            yield "line", _line(raw)
        if finished:
            if pending:
                yield "line", _line(pending)
            yield "end", _end(run)
            return
        await asyncio.sleep(poll_s)


async def _follow_job(
    runs: RunService, run_id: str, tail: int, poll_s: float
) -> AsyncIterator[tuple[str, Any]]:
    """The same events for a Ray job, from the log Ray keeps (read whole each poll: Ray's
    job server hands out no offsets); a partial last line waits until it is complete."""
    sent: int | None = None  # complete lines already accounted for
    while True:
        run = await asyncio.to_thread(runs.row, run_id)
        finished = RunStatus(run.status) in FINISHED
        text = await asyncio.to_thread(runs.job_log, run) or ""
        lines = log_lines(text)
        complete = lines if finished or text.endswith("\n") else lines[:-1]
        if sent is None:
            sent = max(0, len(complete) - tail)
        for line in complete[sent:]:
            yield "line", line
        sent = max(sent, len(complete))
        if finished:
            yield "end", _end(run)
            return
        await asyncio.sleep(poll_s)


def _end(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "status": run.status.value,
        "exit_code": run.exit_code,
        "failure_kind": run.failure_kind,
        "details": run.details,
    }


def _tail_and_offset(path: Path, count: int, max_bytes: int = 1 << 20) -> tuple[list[str], int]:
    """The last `count` complete lines and the offset right after them, from one read, so a
    line written meanwhile is either in the tail or read later, never both. A trailing partial
    line is left for the follow loop to read once it is complete."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read(size - start)
    except OSError:
        return [], 0
    complete = data[: data.rfind(b"\n") + 1]
    offset = start + len(complete)
    if count <= 0:
        return [], offset
    text = complete.decode("utf-8", errors="replace")
    return log_lines(text)[-count:], offset


def _line(raw: bytes) -> str:
    """One line as `log_lines` cuts them, from the bytes before its LF."""
    return raw.decode("utf-8", errors="replace").removesuffix("\r")


def _read_from(path: Path, offset: int, limit: int = 1 << 20) -> tuple[bytes, int]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() < offset:  # truncated or replaced: start again from the top
                offset = 0
            fh.seek(offset)
            data = fh.read(limit)
    except OSError:
        return b"", offset
    return data, offset + len(data)
