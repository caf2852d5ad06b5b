"""A session's requests in time, for `tinker session export-trace`: each request's wait
(submitted, not yet running: queued behind its model's earlier requests, or for the worker)
and its run, per model or sampler, as a Chrome trace-event file that Perfetto opens. Bounded:
the newest MAX_SPANS requests are kept. Also the session's device time: the union of its
requests' runs (samples batched together count once)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

MAX_SPANS = 5000  # about 150 bytes each in the file
TRACE_FILE = "tinker-trace.json"  # in the run's folder, written when the session ends


@dataclass(frozen=True)
class RequestSpan:
    name: str  # the operation: forward_backward, optim_step, sample, ...
    track: str  # the model or sampler it ran on
    submitted: float  # epoch seconds, when its POST reached the server
    answered: float  # epoch seconds, when its answer came back
    run_s: float  # how long it ran in the worker (the rest it waited)
    failed: bool


class SessionTrace:
    def __init__(self) -> None:
        self.spans: deque[RequestSpan] = deque(maxlen=MAX_SPANS)
        self._busy_until = 0.0

    def add(self, span: RequestSpan) -> float:
        """Keep `span`; the device seconds it adds to the session (what of its run no earlier
        request of the session covered)."""
        self.spans.append(span)
        start = span.answered - span.run_s
        added = max(0.0, span.answered - max(start, self._busy_until))
        self._busy_until = max(self._busy_until, span.answered)
        return added

    def chrome_trace(self, session_id: str) -> dict[str, Any]:
        return chrome_trace(session_id, list(self.spans))


def chrome_trace(session_id: str, spans: list[RequestSpan]) -> dict[str, Any]:
    """The trace-event JSON (https://ui.perfetto.dev opens it): one thread per model or
    sampler, a `queued` slice then the request's own slice for each request."""
    tracks: dict[str, int] = {}
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": f"session {session_id}"}}
    ]
    for span in spans:
        if span.track not in tracks:
            tracks[span.track] = tid = len(tracks) + 1
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": 1,
                    "tid": tid,
                    "args": {"name": span.track},
                }
            )
        tid = tracks[span.track]
        start = span.answered - span.run_s
        waited = max(0.0, start - span.submitted)
        if waited > 0:
            events.append(_slice("queued", tid, span.submitted, waited, {"request": span.name}))
        args = {"run_s": round(span.run_s, 6), "queue_s": round(waited, 6), "failed": span.failed}
        events.append(_slice(span.name, tid, start, span.run_s, args))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _slice(
    name: str, tid: int, start: float, duration: float, args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": name,
        "cat": "tinker",
        "pid": 1,
        "tid": tid,
        "ts": round(start * 1e6),
        "dur": round(duration * 1e6),
        "args": args,
    }
