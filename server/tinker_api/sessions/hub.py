"""What the Tinker API's parts share: the live sessions, the futures of their requests, the
engine hosts that do the work, and the sessions' runs in the database (a Recorder). Also how a
session ends, whatever ends it: it records its end, its waiting requests fail, its models are
freed in its host.

Everything here runs on the server's event loop, but for the Recorder's thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy.engine import Engine

from core.checkpoint_check import STATE_KIND
from core.model_names import known_models, model_available
from core.models import RunStatus
from core.settings import Settings
from core.tinker_wire import (
    Answer,
    CreateLoss,
    CreateModel,
    Failed,
    ForwardBackward,
    LoadModel,
    LoadState,
    Op,
    OptimStep,
    Release,
    Released,
    Sample,
    SaveExternal,
    SaveSampler,
    SaveState,
    Snapshot,
    model_of,
    sampler_of,
)
from server.engine.hosts import EngineHosts
from server.errors import BadRequest, DomainError, NotFound, Unavailable
from server.tinker_api import paths
from server.tinker_api.schemas import JsonObject
from server.tinker_api.sessions.futures import FutureRegistry, Outcome, Pending
from server.tinker_api.sessions.records import Recorder, SessionRecords
from server.tinker_api.sessions.session import Model, Session
from server.tinker_api.worker_client import EngineTinker, OnAnswer

log = logging.getLogger(__name__)
A = TypeVar("A", bound=BaseModel)
MIB = 1 << 20


class SessionHub:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        hosts: EngineHosts,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.records = SessionRecords(engine, settings.runs_dir)
        self.recorder = Recorder(self.records)
        self.futures = FutureRegistry(clock, settings.tinker_future_ttl_s)
        self.worker = EngineTinker(hosts, self._worker_exited)
        self.sessions: dict[str, Session] = {}

    def close(self) -> None:
        """The server stops: its sessions end with it (their worker too)."""
        for session in list(self.sessions.values()):
            self.end(
                session,
                RunStatus.failed,
                "lost",
                "the server stopped; a Tinker session does not outlive the server holding it",
                release=False,
            )
        self.worker.stop()
        self.recorder.close()

    def holds(self, run_id: str) -> bool:
        """Is this a live session of this server? (the supervisor's thread asks)"""
        session = self.sessions.get(run_id)
        return session is not None and session.ended is None

    # Beginnings and ends ------------------------------------------------------------------

    async def open(self, created: JsonObject) -> Session:
        """A new session and its run (`created`: what create_session sent)."""
        run_id, run_dir = await self.recorder.read(self.records.create, created)
        session = Session(run_id, run_dir, self.recorder, self.clock)
        self.sessions[run_id] = session
        return session

    def end(
        self,
        session: Session,
        status: RunStatus,
        failure_kind: str | None,
        told: str,
        details: str | None = None,
        *,
        category: str = "user",
        release: bool = True,
    ) -> None:
        """End a session once: it records its end, its waiting futures fail, its models and
        samplers are freed. `told`: what its script's later requests are told."""
        message = session.end(status, failure_kind, told, details)
        if message is None:
            return
        self.futures.fail_session(session.id, message, category)
        if release and session.uses_worker and self.worker.alive(session.host):
            freed = Release(
                models=[m.model_id for m in session.models.values()],
                samplers=list(session.samplers),
                session_id=session.id,
            )
            release_call = self.call(
                session, freed, lambda answer, _: _released(session, answer), ended_ok=True
            )
            asyncio.ensure_future(release_call).add_done_callback(_log_failure)

    def forget_ended(self) -> None:
        """Sessions ended longer ago than a result is kept: nothing of theirs is asked again."""
        now, keep = self.clock(), self.settings.tinker_future_ttl_s
        for session in list(self.sessions.values()):
            if session.ended_at is not None and now - session.ended_at > keep:
                del self.sessions[session.id]

    def _worker_exited(self, host: int, why: str) -> None:
        for session in list(self.sessions.values()):
            if session.uses_worker and session.ended is None and session.host == host:
                session.uses_worker = False  # its models went with the host
                self.end(
                    session,
                    RunStatus.failed,
                    "engine",  # the failure kind runs record for it (kept since issue 28)
                    "the engine host exited (or cut this server off); its models are lost",
                    why,
                    category="server",
                    release=False,
                )

    # Finding and asking -----------------------------------------------------------------

    def session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise NotFound(no_session(session_id))
        if session.ended is not None:
            raise BadRequest(session.ended)
        session.seen()
        return session

    def model(self, model_id: str) -> tuple[Session, Model]:
        owner = paths.parse_model_id(model_id)
        if owner is None:
            raise NotFound(f"model_id: {model_id[:100]!r} is not a model of this server")
        session = self.session(owner[0])
        model = session.models.get(owner[1])
        if model is None or not model.ready:
            raise NotFound(
                f"model_id: no model {model_id} in this session (create_model makes one; wait "
                "for its result before using it)"
            )
        return session, model

    async def submit(
        self,
        session: Session,
        request: Op[A],
        encode: Callable[[A], Outcome],
        target: str | None = None,
        request_id: str | None = None,
    ) -> Pending:
        """A future for a request the worker works on, settled from its answer: `encode`
        turns the request's kind of answer into the future's outcome (`target`: the poll
        target retrieve_futures reports it to; `request_id`: its id, made by the caller).
        The future's kind (in its id) is the request's: future_kind."""
        pending = self.futures.new(session.id, future_kind(request), target, request_id)
        submitted = time.time()
        # Its line in the session's trace: its model, else its sampler, else the session's.
        track = model_of(request) or sampler_of(request)
        if track is None:
            track = session.id

        def answered(answer: Answer, run_s: float) -> None:
            session.timed(request.op, track, submitted, run_s, isinstance(answer, Failed))
            outcome: Outcome
            expected = request.answered_by(answer)
            if isinstance(answer, Failed):
                outcome = Outcome(error=answer.error, category=answer.category)
            elif expected is None:
                what = f"{type(request).__name__} with {answer.kind}"
                outcome = Outcome(error=f"the engine host answered {what}", category="server")
            else:
                try:
                    outcome = encode(expected)
                except Exception as exc:
                    log.exception("the answer of %s could not be recorded", type(request).__name__)
                    outcome = Outcome(error=f"{type(exc).__name__}: {exc}", category="server")
            self.futures.settle(pending.request_id, outcome)

        try:
            await self.call(session, request, answered)
        except BaseException:
            self.futures.settle(pending.request_id, Outcome(error="not submitted"))
            raise
        return pending

    async def call(
        self,
        session: Session,
        request: Op[Any],
        on_answer: OnAnswer | None = None,
        ended_ok: bool = False,
    ) -> None:
        """Send a request to the worker for `session`, answering its POST's refusal."""
        if session.ended is not None and not ended_ok:
            raise BadRequest(session.ended)
        host = await self.place(session, None)
        session.uses_worker = True
        with session.busy():
            refusal = await self.worker.call(request, on_answer, host)
        if refusal is None:
            return
        if refusal.status >= 500 and refusal.status != 500:
            raise Unavailable(refusal.detail)
        if refusal.status == 404:
            raise NotFound(refusal.detail)
        suffix = "" if refusal.status < 500 else f" (a bug; see {self.worker.log_path(host)})"
        raise BadRequest(refusal.detail + suffix)

    async def place(self, session: Session, base: str | None) -> int:
        """The engine host of `session`: where it was placed, else (its first model or sampler,
        on `base`) the host placement chooses now, for the session's life."""
        if session.host is None:
            session.host = await self.worker.place(base)
        return session.host

    def failed_now(
        self, session: Session, kind: str, outcome: Outcome, model_id: str | None = None
    ) -> JsonObject:
        """A request refused before it reached the worker, answered as Tinker does: a failed
        future (category user), not an HTTP error; `kind`: the one its request would have had
        (future_kind)."""
        pending = self.futures.new(session.id, kind)
        self.futures.settle(pending.request_id, outcome)
        answer: JsonObject = {"request_id": pending.request_id}
        if model_id is not None:
            answer["model_id"] = model_id
        return answer

    async def state_folder(self, path: str) -> Path | Outcome:
        try:
            return await self.checkpoint_folder(path, "path", STATE_KIND)
        except DomainError as exc:
            return Outcome(error=exc.detail, category="user")

    async def checkpoint_folder(self, path: str, field: str, kind: str | None = None) -> Path:
        """The folder a tinker:// path of this server names, checked to hold a checkpoint."""
        try:
            ref = paths.parse(path, field)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if kind is not None and ref.kind != kind:
            raise BadRequest(
                f"{field}: {path} is a {paths.CHECKPOINT_TYPES[ref.kind]} checkpoint; loading a "
                "training state needs a /weights/ path (save_state makes one)"
            )
        run = await self.recorder.read(self.records.run, ref.session_id)
        folder = ref.folder(Path(run.run_dir)) if run is not None else None
        if folder is None or not (folder / ref.record_file).is_file():
            raise BadRequest(f"{field}: no checkpoint at {path} (never saved, or deleted)")
        return folder

    async def check_base_model(self, name: str, field: str) -> None:
        ok, why = await asyncio.to_thread(
            model_available, name, self.settings.models_dir, check_hub=True
        )
        if not ok:
            served = ", ".join(known_models())
            raise BadRequest(
                f"{field}: {name!r} cannot be trained here: {why}. Models here: {served}, or "
                "a local folder (GET /api/v1/get_server_capabilities lists them)."
            )


def future_kind(request: Op[Any]) -> str:
    """The kind a request's future has, the middle of its id (`<session>:train:<hex>`): the
    SDK's operation it serves, which several requests share (a save of any kind is "save")."""
    match request:
        case CreateModel():
            return "create_model"
        case LoadModel() | LoadState():
            return "load_weights"
        case ForwardBackward() | OptimStep():
            return "train"
        case SaveState() | SaveSampler() | SaveExternal() | Snapshot():
            return "save"
        case Sample():
            return "sample"
        case CreateLoss():
            return "create_custom_loss"
        case _:
            return request.op


def no_session(session_id: str) -> str:
    return (
        f"session_id: no Tinker session {session_id[:80]} on this server (it ended long ago, "
        "or the server restarted); start a new ServiceClient"
    )


def _released(session: Session, answer: Answer) -> None:
    match answer:
        case Released(held=held):
            what = ", ".join(
                f"{m.model} ({m.size_bytes / MIB:.0f} MiB, {m.users} user(s))" for m in held
            )
            session.note(f"models freed; the worker now holds {what or 'no model'}")
        case Failed(error=error):
            session.note(f"freeing its models failed: {error}")
        case _:
            session.note(f"freeing its models was answered with {answer.kind}")


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("releasing a session's models failed: %s", task.exception())
