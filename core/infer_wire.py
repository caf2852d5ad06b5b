"""What the server and its inference worker (runners.infer) say to each other, one JSON line
each: a job (core.spec) with the id its answer carries back, or the cancel of one; back, a
streamed chat's new text as it decodes, then the job's answer (a JSON object: the worker's
results, or `ok: false` with the error's kind).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from core.line import Line
from core.spec import ChatJob, InferenceJob, WarmJob


class Job(Line):
    kind: Literal["job"] = "job"
    id: int
    job: InferenceJob | ChatJob | WarmJob = Field(discriminator="op")


class Cancel(Line):
    """Its client went away: the worker stops the job's local sampling at the next step."""

    kind: Literal["cancel"] = "cancel"
    id: int


class Partial(Line):
    """New text of one choice of a streamed chat, before its answer."""

    kind: Literal["partial"] = "partial"
    id: int
    index: int
    delta: str


class Done(Line):
    """A job's answer; `id` is None for a line that was not a job at all."""

    kind: Literal["done"] = "done"
    id: int | None
    body: dict[str, Any]


ToWorker = Annotated[Job | Cancel, Field(discriminator="kind")]
FromWorker = Annotated[Partial | Done, Field(discriminator="kind")]
TO_WORKER: TypeAdapter[ToWorker] = TypeAdapter(ToWorker)
FROM_WORKER: TypeAdapter[FromWorker] = TypeAdapter(FromWorker)


def error_answer(exc: BaseException) -> dict[str, Any]:
    """A failed job's answer: its error, and its kind where the server maps it to a status."""
    kind = {
        "ModelNotAvailable": "model",
        "TinkerUnavailable": "backend",
        "TinkerUnreachable": "backend",
    }.get(type(exc).__name__, "error")
    return {"ok": False, "kind": kind, "error": f"{type(exc).__name__}: {exc}"}
