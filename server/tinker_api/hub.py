"""What the Tinker API's parts share: the live sessions, the futures of their requests, the
engine process that does the work, and the session's run in the database (written by one
thread, in order: a step is recorded before the next). Also how a session ends, whatever ends
it: its waiting requests fail, its models are freed, its run records the end.

Everything here runs on the server's event loop, but for the database thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from core.checkpoint_check import RECORDS, STATE_KIND
from core.model_names import known_models, model_available
from core.models import RunStatus
from core.settings import Settings
from server.errors import BadRequest, DomainError, NotFound, Unavailable
from server.tinker_api import paths
from server.tinker_api.engine_client import EngineProcess, Message
from server.tinker_api.futures import FutureRegistry, Outcome, Pending
from server.tinker_api.records import SessionRecords
from server.tinker_api.sessions import Model, Session

log = logging.getLogger(__name__)
Answer = dict[str, Any]
MIB = 1 << 20


class SessionHub:
    def __init__(
        self, settings: Settings, engine: Engine, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.records = SessionRecords(engine, settings.runs_dir)
        self.futures = FutureRegistry(clock, settings.tinker_future_ttl_s)
        self.engine = EngineProcess(settings, self._engine_exited)
        self.sessions: dict[str, Session] = {}
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-db")

    def close(self) -> None:
        """The server stops: its sessions end with it (their engine too)."""
        for session in list(self.sessions.values()):
            self.end(
                session,
                RunStatus.failed,
                "lost",
                "the server stopped; a Tinker session does not outlive the server holding it",
                release=False,
            )
        self.engine.stop()
        self._db.shutdown(wait=True)

    def holds(self, run_id: str) -> bool:
        """Is this a live session of this server? (the supervisor's thread asks)"""
        session = self.sessions.get(run_id)
        return session is not None and session.ended is None

    def write(self, fn: Callable[..., Any], *args: Any) -> None:
        """A database write, after those before it."""
        self._db.submit(fn, *args)

    # Ends --------------------------------------------------------------------------------

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
        """End a session once: its waiting futures fail, its models and samplers are freed,
        its run records the end. `told`: what its script's later requests are told."""
        if session.ended is not None:
            return
        message = f"This Tinker session (run {session.id}) has ended: {told}."
        session.ended, session.ended_at = message, self.clock()
        self.futures.fail_session(session.id, message, category)
        if release and session.uses_engine and self.engine.pid is not None:
            models = [m.model_id for m in session.models.values()]
            samplers = list(session.samplers)
            release_call = self.call_engine(
                session,
                "release",
                lambda answer: self._released(session, answer),
                ended_ok=True,
                models=models,
                samplers=samplers,
            )
            asyncio.ensure_future(release_call).add_done_callback(_log_failure)
        why = details or told
        self.note(session.run_dir, f"session ended ({status.value}): {why}")
        self.write(self.records.end, session.id, status, failure_kind, why)
        log.info("Tinker session %s ended (%s): %s", session.id, status.value, why)

    def _released(self, session: Session, answer: Message) -> None:
        if "error" in answer:
            self.note(session.run_dir, f"freeing its models failed: {answer['error']}")
            return
        held = answer["json"]["loaded"]
        what = ", ".join(
            f"{m['model']} ({m['bytes'] / MIB:.0f} MiB, {m['users']} user(s))" for m in held
        )
        self.note(session.run_dir, f"models freed; the engine now holds {what or 'no model'}")

    def _engine_exited(self, why: str) -> None:
        for session in list(self.sessions.values()):
            if session.uses_engine and session.ended is None:
                session.uses_engine = False  # its models died with the engine
                self.end(
                    session,
                    RunStatus.failed,
                    "engine",
                    "the Tinker engine process exited; its models are lost",
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
        session.last_seen = self.clock()
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

    async def to_engine(
        self,
        session: Session,
        kind: str,
        op: str,
        encode: Callable[[Message], Outcome],
        **fields: Any,
    ) -> Pending:
        """A future for a request the engine works on; settled from its answer."""
        pending = self.futures.new(session.id, kind)

        def answered(message: Message) -> None:
            if "error" in message:
                outcome = Outcome(error=str(message["error"]), category=message["category"])
            else:
                try:
                    outcome = encode(message)
                except Exception as exc:
                    log.exception("answer of %s could not be recorded", op)
                    outcome = Outcome(error=f"{type(exc).__name__}: {exc}", category="server")
            self.futures.settle(pending.request_id, outcome)

        try:
            await self.call_engine(session, op, answered, **fields)
        except BaseException:
            self.futures.settle(pending.request_id, Outcome(error="not submitted"))
            raise
        return pending

    async def call_engine(
        self,
        session: Session,
        op: str,
        answer: Callable[[Message], None] | None = None,
        ended_ok: bool = False,
        **fields: Any,
    ) -> None:
        if session.ended is not None and not ended_ok:
            raise BadRequest(session.ended)
        session.uses_engine = True
        session.waiting += 1
        try:
            refusal = await self.engine.call(op, answer, **fields)
        finally:
            session.waiting -= 1
            session.last_seen = self.clock()
        if refusal is None:
            return
        if refusal.status >= 500 and refusal.status != 500:
            raise Unavailable(refusal.detail)
        if refusal.status == 404:
            raise NotFound(refusal.detail)
        suffix = "" if refusal.status < 500 else f" (a bug; see {self.engine.log_path})"
        raise BadRequest(refusal.detail + suffix)

    def failed_now(self, session: Session, outcome: Outcome, model_id: str | None = None) -> Answer:
        """A request refused before it reached the engine, answered as Tinker does: a failed
        future (category user), not an HTTP error."""
        pending = self.futures.new(session.id, "load_weights")
        self.futures.settle(pending.request_id, outcome)
        answer = {"request_id": pending.request_id}
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
                f"{field}: {path} is a sampler checkpoint; loading a training state needs a "
                "/weights/ path (save_state makes one)"
            )
        run = await self.in_db(self.records.run, ref.session_id)
        folder = ref.folder(Path(run.run_dir)) if run is not None else None
        if folder is None or not (folder / RECORDS[ref.kind]).is_file():
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

    async def in_db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    async def written(self) -> None:
        """Once every write submitted so far is done (one writer thread: they run in order)."""
        await self.in_db(lambda: None)

    def note(self, run_dir: Path, line: str) -> None:
        self.write(self.records.log, run_dir, line)


def no_session(session_id: str) -> str:
    return (
        f"session_id: no Tinker session {session_id[:80]} on this server (it ended long ago, "
        "or the server restarted); start a new ServiceClient"
    )


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("releasing a session's models failed: %s", task.exception())
