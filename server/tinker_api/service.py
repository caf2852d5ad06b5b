"""The Tinker API's control plane: sessions (each a run), their models and samplers, requests
passed to the engine process and their futures, retried requests applied once, and the ends
of sessions (finished, stopped through our API, gone quiet, or their engine died).

Everything runs on the server's event loop, except database writes, which go through one
thread in order (a step is recorded before the next), and the supervisor's calls (launcher.py),
which hop onto the loop.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from core.checkpoint_check import RECORDS, SAMPLER_KIND, STATE_KIND
from core.model_names import context_length, known_models, model_available
from core.models import RunStatus
from core.settings import Settings
from server.errors import BadRequest, DomainError, Gone, NotFound, Unavailable
from server.tinker_api import paths, schemas
from server.tinker_api.engine_client import EngineProcess, Message
from server.tinker_api.futures import JSON, PROTO, FutureRegistry, Outcome, Pending
from server.tinker_api.proto_header import ProtoHeaderError, model_and_seq
from server.tinker_api.records import SessionRecords
from server.tinker_api.sessions import Model, Sampler, Session, StepTally

log = logging.getLogger(__name__)
Answer = dict[str, Any]
# The flags that keep the SDK on the paths served here (the rest keep its defaults): plain
# httpx, no JWT exchange, per-request future polling, client-side custom losses, plain
# protobuf bodies sent one chunk after another.
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "use_pyqwest_transport": False,
    "sample_use_retrieve_futures": False,
    "sample_join_sampling_session": False,
    "custom_loss_server_side": False,
    "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": False,
}
MIB = 1 << 20
SAMPLE_CONCURRENCY = 256  # in-flight samples per sampling client (each holds a long poll)
ENGINE_KINDS = frozenset({"create_model", "load_weights", "train", "save", "sample"})


class TinkerService:
    def __init__(
        self, settings: Settings, engine: Engine, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings
        self._clock = clock
        self.records = SessionRecords(engine, settings.runs_dir)
        self.futures = FutureRegistry(clock, settings.tinker_future_ttl_s)
        self.engine = EngineProcess(settings, self._engine_exited)
        self._sessions: dict[str, Session] = {}
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-db")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task[None] | None = None

    # Running in the lifespan -------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="tinker-sweeper")

    async def stop(self) -> None:
        """The server stops: its sessions end with it (their engine too)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for session in list(self._sessions.values()):
            self._end(
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
        session = self._sessions.get(run_id)
        return session is not None and session.ended is None

    def request_stop(self, run_id: str) -> None:
        """POST /runs/{id}/stop marked the run stopping (any thread): end the session now."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop_if_held, run_id)

    # Handshake ---------------------------------------------------------------------------

    def client_config(self) -> Answer:
        chunk = self._settings.tinker_max_body_bytes // 4  # the SDK's size is an estimate
        return {
            **CLIENT_CONFIG,
            "fwdbwd_max_chunk_bytes_count": min(5_000_000, chunk),
            "sample_max_concurrent_requests": SAMPLE_CONCURRENCY,
        }

    async def create_session(self, body: schemas.CreateSessionIn) -> Answer:
        info = body.model_dump(mode="json")
        run_id, run_dir = await self._in_db(self.records.create, info)
        self._sessions[run_id] = Session(run_id, run_dir, last_seen=self._clock())
        self._note(run_dir, f"session started: tinker SDK {body.sdk_version or '?'}")
        log.info("Tinker session %s started", run_id)
        return {"type": "create_session", "session_id": run_id}

    def heartbeat(self, session_id: str) -> Answer:
        session = self._sessions.get(session_id)
        if session is None:
            raise Gone(_no_session(session_id))  # 410 stops the SDK's heartbeat loop
        if session.ended is not None:
            raise Gone(session.ended)
        session.last_seen = self._clock()
        return {"type": "session_heartbeat"}

    def finish(self, session_id: str, body: schemas.FinishIn) -> Answer:
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(_no_session(session_id))
        if session.ended is None:
            kind = body.reason.type
            detail = f"the script closed its session ({kind})"
            if body.detail:
                detail += f": {body.detail[:2000]}"
            status, failure = {
                "success": (RunStatus.succeeded, None),
                "interrupted": (RunStatus.stopped, None),
            }.get(kind, (RunStatus.failed, "script"))
            self._end(session, status, failure, f"this session was closed ({kind})", detail)
        return {}

    # Models ------------------------------------------------------------------------------

    async def create_model(self, body: schemas.CreateModelIn) -> Answer:
        session = self._session(body.session_id)
        return await session.once(
            ("model", body.model_seq_id), lambda: self._create_model(session, body)
        )

    async def _create_model(self, session: Session, body: schemas.CreateModelIn) -> Answer:
        await self._check_base_model(body.base_model, "base_model")
        model_id = paths.model_id(session.id, body.model_seq_id)
        lora = body.lora_config
        model = Model(model_id, body.model_seq_id, body.base_model, lora.rank, body.user_metadata)
        session.models[model.seq] = model
        pending = await self._to_engine(
            session,
            "create_model",
            "create_model",
            lambda message: self._model_ready(
                session, model, message, {"model_id": model_id, "type": "create_model"}
            ),
            model_id=model_id,
            base_model=body.base_model,
            lora=lora.model_dump(),
            checkpoint_dir=str(paths.model_folder(session.run_dir, model.seq)),
        )
        return {"request_id": pending.request_id, "model_id": model_id}

    def get_info(self, model_id: str) -> Answer:
        _, model = self._model(model_id)
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_data": {
                "arch": model.info.get("arch"),
                "model_name": model.base_model,
                "tokenizer_id": model.info.get("tokenizer_id") or model.base_model,
            },
            "is_lora": True,
            "lora_rank": model.lora_rank,
            "model_name": model.base_model,
        }

    async def forward_backward(self, body: bytes) -> Answer:
        try:
            model_id, seq_id = model_and_seq(body)
        except ProtoHeaderError as exc:
            raise BadRequest(str(exc)) from None
        session, model = self._model(model_id)
        encoded = base64.b64encode(body).decode("ascii")

        async def submit() -> Answer:
            pending = await self._to_engine(
                session,
                "train",
                "forward_backward",
                lambda message: self._trained(session, message),
                model_id=model_id,
                body=encoded,
            )
            return {"request_id": pending.request_id, "model_id": model_id}

        return await session.once((model_id, seq_id), submit)

    async def optim_step(self, body: schemas.OptimStepIn) -> Answer:
        session, model = self._model(body.model_id)
        return await self._model_op(
            session,
            model,
            body.seq_id,
            "train",
            "optim_step",
            lambda message: self._stepped(session, message),
            params=body.params(),
        )

    async def save_weights(self, body: schemas.SaveWeightsIn) -> Answer:
        session, model = self._model(body.model_id)
        name = body.path or f"state-{session.step:06d}"
        return await self._model_op(
            session,
            model,
            body.seq_id,
            "save",
            "save_state",
            lambda message: self._saved(session, model, STATE_KIND, name, message),
            name=name,
            overwrite=body.overwrite,
            user_metadata=body.user_metadata,
        )

    async def save_weights_for_sampler(self, body: schemas.SaveSamplerIn) -> Answer:
        session, model = self._model(body.model_id)
        if body.path:
            name = body.path
            return await self._model_op(
                session,
                model,
                body.seq_id,
                "save",
                "save_sampler",
                lambda message: self._saved(session, model, SAMPLER_KIND, name, message),
                name=name,
                user_metadata=body.user_metadata,
            )
        # No name: a sampler over the weights as they are (save_weights_and_get_sampling_
        # client); "inflight" is served as a snapshot.
        if body.sampling_session_seq_id is None:
            raise BadRequest(
                "sampling_session_seq_id: a save_weights_for_sampler without a name (path) "
                "makes a sampler and needs its sequence id"
            )
        sampler_id = _sampler_id(session.id, body.sampling_session_seq_id)
        session.samplers.setdefault(sampler_id, Sampler(sampler_id, model.base_model, None))
        answer = {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}
        return await self._model_op(
            session,
            model,
            body.seq_id,
            "save",
            "snapshot",
            lambda message: _json(answer),
            sampler_id=sampler_id,
        )

    async def load_weights(self, body: schemas.LoadWeightsIn) -> Answer:
        if body.model_id:  # the deprecated form: into an existing model
            session, model = self._model(body.model_id)
            return await session.once(
                (model.model_id, body.seq_id), lambda: self._load_into(session, model, body)
            )
        if body.session_id is None or body.model_seq_id is None:
            raise BadRequest(
                "load_weights: name the model (model_id and seq_id), or the new model's "
                "session_id and model_seq_id"
            )
        session = self._session(body.session_id)
        return await session.once(
            ("model", body.model_seq_id), lambda: self._load_new(session, body)
        )

    async def _load_into(
        self, session: Session, model: Model, body: schemas.LoadWeightsIn
    ) -> Answer:
        answer = {"path": body.path, "model_id": model.model_id, "type": "load_weights"}
        folder = await self._state_folder(body.path)
        if isinstance(folder, Outcome):
            return self._failed_now(session, folder)
        pending = await self._to_engine(
            session,
            "load_weights",
            "load_state",
            lambda message: _json(answer),
            model_id=model.model_id,
            folder=str(folder),
            optimizer=body.optimizer,
        )
        return {"request_id": pending.request_id, "model_id": model.model_id}

    async def _load_new(self, session: Session, body: schemas.LoadWeightsIn) -> Answer:
        assert body.model_seq_id is not None
        model_id = paths.model_id(session.id, body.model_seq_id)
        folder = await self._state_folder(body.path)
        if isinstance(folder, Outcome):
            return self._failed_now(session, folder, model_id)
        record = await asyncio.to_thread(_read_record, folder, STATE_KIND)
        base = body.base_model or str(record.get("base_model", ""))
        rank = (record.get("lora") or {}).get("rank")
        model = Model(model_id, body.model_seq_id, base, rank, body.user_metadata)
        session.models[model.seq] = model
        answer = {"path": body.path, "model_id": model_id, "type": "load_weights"}
        pending = await self._to_engine(
            session,
            "load_weights",
            "load_model",
            lambda message: self._model_ready(session, model, message, answer),
            model_id=model_id,
            folder=str(folder),
            optimizer=body.optimizer,
            base_model=body.base_model,
            checkpoint_dir=str(paths.model_folder(session.run_dir, model.seq)),
        )
        return {"request_id": pending.request_id, "model_id": model_id}

    # Sampling ----------------------------------------------------------------------------

    async def create_sampling_session(self, body: schemas.CreateSamplerIn) -> Answer:
        session = self._session(body.session_id)
        sampler_id = _sampler_id(session.id, body.sampling_session_seq_id)
        if sampler_id in session.samplers:  # a retried request
            return {"type": "create_sampling_session", "sampling_session_id": sampler_id}
        if body.model_path:
            folder = await self._checkpoint_folder(body.model_path, "model_path")
            record = await asyncio.to_thread(_read_record, folder, None)
            base = str(record.get("base_model", ""))
            opened: dict[str, Any] = {"folder": str(folder)}
        elif body.base_model:
            await self._check_base_model(body.base_model, "base_model")
            base, opened = body.base_model, {"base_model": body.base_model}
        else:
            raise BadRequest(
                "create_sampling_session: give model_path (a tinker:// path that "
                "save_weights_for_sampler returned) or base_model"
            )
        await self._call_engine(session, "open_sampler", sampler_id=sampler_id, **opened)
        session.samplers[sampler_id] = Sampler(sampler_id, base, body.model_path)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def sampler(self, sampler_id: str) -> Answer:
        session = self._session(sampler_id.partition(":sample:")[0])
        sampler = session.samplers.get(sampler_id)
        if sampler is None:
            raise NotFound(f"sampler_id: no sampler {sampler_id[:100]} in this session")
        return {
            "sampler_id": sampler.sampler_id,
            "base_model": sampler.base_model,
            "model_path": sampler.model_path,
        }

    async def asample(self, body: schemas.SampleIn) -> Answer:
        if not body.sampling_session_id:
            raise BadRequest(
                "sampling_session_id: missing; sample through a sampling client (from "
                "create_sampling_client or save_weights_and_get_sampling_client)"
            )
        session = self._session(body.sampling_session_id.partition(":sample:")[0])
        if body.sampling_session_id not in session.samplers:
            raise NotFound(
                f"sampling_session_id: no sampler {body.sampling_session_id[:100]} in this session"
            )
        request = body.model_dump(
            mode="json", exclude={"sampling_session_id", "seq_id", "base_model", "model_path"}
        )

        async def submit() -> Answer:
            pending = await self._to_engine(
                session,
                "sample",
                "sample",
                lambda message: self._sampled(session, message),
                sampler_id=body.sampling_session_id,
                request=request,
            )
            ids = [f"{pending.request_id}:{i}" for i in range(body.num_samples)]
            return {"request_id": pending.request_id, "sample_sequence_ids": ids}

        if body.seq_id is None:
            return await submit()
        return await session.once(("sample", body.sampling_session_id, body.seq_id), submit)

    # Futures -----------------------------------------------------------------------------

    async def retrieve(
        self, body: schemas.RetrieveIn, gone: Callable[[], Awaitable[bool]] | None = None
    ) -> Outcome | Answer:
        pending = self.futures.get(body.request_id)
        if pending is None:
            # 410: the SDK sends a sampling request again; a training one it reports.
            raise Gone(
                f"request_id: {body.request_id[:120]} is unknown or its result expired (results "
                f"are kept {self._settings.tinker_future_ttl_s:.0f} s, and not across a server "
                "restart)"
            )
        session = self._sessions.get(pending.session_id)
        if session is not None:
            session.waiting += 1
        try:
            hold = self._settings.tinker_poll_hold_s
            outcome = await self.futures.wait(body.request_id, hold, gone)
        finally:
            if session is not None:
                session.waiting -= 1
                session.last_seen = self._clock()
        if outcome is None:
            return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
        return outcome

    # Capabilities ------------------------------------------------------------------------

    def capabilities(self) -> Answer:
        names = list(known_models())
        for session in self._sessions.values():
            for model in session.models.values():
                if model.base_model not in names:
                    names.append(model.base_model)
        models_dir = self._settings.models_dir
        return {
            "supported_models": [
                {
                    "model_name": name,
                    "max_context_length": context_length(name, models_dir),
                    "trainable": True,
                    "sampleable": True,
                }
                for name in names
            ]
        }

    # Ends --------------------------------------------------------------------------------

    def _end(
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
        session.ended, session.ended_at = message, self._clock()
        self.futures.fail_session(session.id, message, category)
        if release and session.uses_engine and self.engine.pid is not None:
            models = [m.model_id for m in session.models.values()]
            samplers = list(session.samplers)
            release_call = self._call_engine(
                session,
                "release",
                lambda answer: self._released(session, answer),
                ended_ok=True,
                models=models,
                samplers=samplers,
            )
            asyncio.ensure_future(release_call).add_done_callback(_log_failure)
        why = details or told
        self._note(session.run_dir, f"session ended ({status.value}): {why}")
        self._db.submit(self.records.end, session.id, status, failure_kind, why)
        log.info("Tinker session %s ended (%s): %s", session.id, status.value, why)

    def _released(self, session: Session, answer: Message) -> None:
        if "error" in answer:
            self._note(session.run_dir, f"freeing its models failed: {answer['error']}")
            return
        held = answer["json"]["loaded"]
        what = ", ".join(
            f"{m['model']} ({m['bytes'] / MIB:.0f} MiB, {m['users']} user(s))" for m in held
        )
        self._note(session.run_dir, f"models freed; the engine now holds {what or 'no model'}")

    def _stop_if_held(self, run_id: str) -> None:
        session = self._sessions.get(run_id)
        if session is not None and session.ended is None:
            self._end(
                session,
                RunStatus.stopped,
                None,
                f"it was stopped through the control server (POST /runs/{run_id}/stop)",
                f"stopped on request (POST /runs/{run_id}/stop): the session ended and its "
                "models were freed",
            )

    def _engine_exited(self, why: str) -> None:
        for session in list(self._sessions.values()):
            if session.uses_engine and session.ended is None:
                session.uses_engine = False  # its models died with the engine
                self._end(
                    session,
                    RunStatus.failed,
                    "engine",
                    "the Tinker engine process exited; its models are lost",
                    why,
                    category="server",
                    release=False,
                )

    async def _sweep_forever(self) -> None:
        every = max(0.05, min(1.0, self._settings.supervisor_interval_s))
        while True:
            await asyncio.sleep(every)
            try:
                await self.sweep()
            except Exception:  # a bad sweep must not end the sweeping
                log.exception("Tinker session sweep failed")

    async def sweep(self) -> None:
        """Sessions whose script went quiet end (lost); those stopped through our API (on any
        server) end (stopped); old results and long-ended sessions are forgotten."""
        now = self._clock()
        self.futures.expire()
        timeout = self._settings.tinker_session_timeout_s
        live = [s for s in self._sessions.values() if s.ended is None]
        for session in live:
            quiet = 0.0 if session.waiting else now - session.last_seen
            if quiet > timeout:
                self._went_quiet(session, quiet, timeout)
        live_ids = [s.id for s in live if s.ended is None]
        if live_ids:
            for run_id in await self._in_db(self.records.stopping, live_ids):
                self._stop_if_held(run_id)
        forget = self._settings.tinker_future_ttl_s
        for session in list(self._sessions.values()):
            if session.ended_at is not None and now - session.ended_at > forget:
                del self._sessions[session.id]

    def _went_quiet(self, session: Session, quiet: float, timeout: float) -> None:
        """Its script sent nothing for too long: the SDK heartbeats every 10 s while its
        process lives, so the process is gone. With answers it never had, it died mid-work
        (lost); with all it asked answered, it most likely ended without closing its session
        (succeeded, saying so): the server cannot tell those apart any better."""
        unfinished = self.futures.unfinished(session.id)
        silence = (
            f"the script sent nothing (not even a heartbeat, which the SDK sends every 10 s) "
            f"for {quiet:.0f} s (RLCS_TINKER_SESSION_TIMEOUT_S={timeout:g})"
        )
        if unfinished:
            details = (
                f"lost: {silence} with {unfinished} request(s) unanswered: it died or lost its "
                "connection. Its models were freed."
            )
            self._end(
                session,
                RunStatus.failed,
                "lost",
                f"its script sent nothing for {quiet:.0f} s",
                details,
            )
        else:
            details = (
                f"{silence}, every request answered: the script most likely ended without "
                "closing its session (ServiceClient.close(), or `with ServiceClient()`, ends a "
                "run at once). Its models were freed."
            )
            self._end(session, RunStatus.succeeded, None, "its script went quiet", details)

    # Answers from the engine -------------------------------------------------------------

    def _model_ready(
        self, session: Session, model: Model, message: Message, answer: Answer
    ) -> Outcome:
        info = message["json"]
        model.info = info
        model.base_model = info.get("base_model") or model.base_model
        model.lora_rank = info.get("lora_rank", model.lora_rank)
        model.ready = True
        self._db.submit(self.records.add_model, session.id, model.seq, model.record())
        self._note(
            session.run_dir,
            f"model {model.model_id}: {model.base_model}, LoRA rank {model.lora_rank}",
        )
        return _json(answer)

    def _trained(self, session: Session, message: Message) -> Outcome:
        stats = message.get("stats") or {}
        if not stats.get("forward_only"):
            session.tally.loss += float(stats.get("loss") or 0.0)
            session.tally.trained_tokens += int(stats.get("tokens") or 0)
        return Outcome(PROTO, base64.b64decode(message["proto"]))

    def _stepped(self, session: Session, message: Message) -> Outcome:
        metrics = message["json"]["metrics"]
        tally, now = session.tally, self._clock()
        session.step += 1
        values = {
            "train/loss": tally.loss,
            "train/grad_norm": metrics.get("grad_norm"),
            "train/learning_rate": metrics.get("learning_rate"),
            "train/tokens": tally.trained_tokens,
            "sampler/tokens": tally.sampled_tokens,
            "time/step": now - tally.started if tally.started else None,
        }
        session.tally = StepTally(started=now)
        self._db.submit(self.records.step, session.id, session.step, values)
        self._note(
            session.run_dir,
            f"step {session.step}: loss {tally.loss:.4g}, grad norm "
            f"{metrics.get('grad_norm', float('nan')):.4g}, {tally.trained_tokens} tokens "
            f"trained, {tally.sampled_tokens} sampled",
        )
        return _json({"metrics": metrics, "type": "optim_step"})

    def _saved(
        self, session: Session, model: Model, kind: str, name: str, message: Message
    ) -> Outcome:
        folder = message["json"]["folder"]
        ref = paths.CheckpointRef(session.id, model.seq, kind, name)
        self._db.submit(self.records.checkpoint, session.id, session.step, kind, name, folder)
        self._note(session.run_dir, f"saved {ref.path}")
        kind_name = "save_weights" if kind == STATE_KIND else "save_weights_for_sampler"
        return _json({"path": ref.path, "type": kind_name})

    def _sampled(self, session: Session, message: Message) -> Outcome:
        session.tally.sampled_tokens += int((message.get("stats") or {}).get("tokens") or 0)
        return Outcome(PROTO, base64.b64decode(message["proto"]))

    # Helpers -----------------------------------------------------------------------------

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(_no_session(session_id))
        if session.ended is not None:
            raise BadRequest(session.ended)
        session.last_seen = self._clock()
        return session

    def _model(self, model_id: str) -> tuple[Session, Model]:
        owner = paths.parse_model_id(model_id)
        if owner is None:
            raise NotFound(f"model_id: {model_id[:100]!r} is not a model of this server")
        session = self._session(owner[0])
        model = session.models.get(owner[1])
        if model is None or not model.ready:
            raise NotFound(
                f"model_id: no model {model_id} in this session (create_model makes one; wait "
                "for its result before using it)"
            )
        return session, model

    async def _model_op(
        self,
        session: Session,
        model: Model,
        seq_id: int | None,
        kind: str,
        op: str,
        encode: Callable[[Message], Outcome],
        **fields: Any,
    ) -> Answer:
        async def submit() -> Answer:
            pending = await self._to_engine(
                session, kind, op, encode, model_id=model.model_id, **fields
            )
            return {"request_id": pending.request_id, "model_id": model.model_id}

        if seq_id is None:
            return await submit()
        return await session.once((model.model_id, seq_id), submit)

    async def _to_engine(
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
            await self._call_engine(session, op, answered, **fields)
        except BaseException:
            self.futures.settle(pending.request_id, Outcome(error="not submitted"))
            raise
        return pending

    async def _call_engine(
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
            session.last_seen = self._clock()
        if refusal is None:
            return
        if refusal.status >= 500 and refusal.status != 500:
            raise Unavailable(refusal.detail)
        if refusal.status == 404:
            raise NotFound(refusal.detail)
        suffix = "" if refusal.status < 500 else f" (a bug; see {self.engine.log_path})"
        raise BadRequest(refusal.detail + suffix)

    def _failed_now(
        self, session: Session, outcome: Outcome, model_id: str | None = None
    ) -> Answer:
        """A request refused before it reached the engine, answered as Tinker does: a failed
        future (category user), not an HTTP error."""
        pending = self.futures.new(session.id, "load_weights")
        self.futures.settle(pending.request_id, outcome)
        answer = {"request_id": pending.request_id}
        if model_id is not None:
            answer["model_id"] = model_id
        return answer

    async def _state_folder(self, path: str) -> Path | Outcome:
        try:
            return await self._checkpoint_folder(path, "path", STATE_KIND)
        except DomainError as exc:
            return Outcome(error=exc.detail, category="user")

    async def _checkpoint_folder(self, path: str, field: str, kind: str | None = None) -> Path:
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
        run = await self._in_db(self.records.run, ref.session_id)
        folder = ref.folder(Path(run.run_dir)) if run is not None else None
        if folder is None or not (folder / RECORDS[ref.kind]).is_file():
            raise BadRequest(f"{field}: no checkpoint at {path} (never saved, or deleted)")
        return folder

    async def _check_base_model(self, name: str, field: str) -> None:
        ok, why = await asyncio.to_thread(
            model_available, name, self._settings.models_dir, check_hub=True
        )
        if not ok:
            served = ", ".join(known_models())
            raise BadRequest(
                f"{field}: {name!r} cannot be trained here: {why}. Models here: {served}, or "
                "a local folder (GET /api/v1/get_server_capabilities lists them)."
            )

    async def _in_db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    def _note(self, run_dir: Path, line: str) -> None:
        self._db.submit(self.records.log, run_dir, line)


def _json(value: Answer) -> Outcome:
    import json

    return Outcome(JSON, json.dumps(value).encode())


def _sampler_id(session_id: str, seq: int) -> str:
    return f"{session_id}:sample:{seq}"


def _no_session(session_id: str) -> str:
    return (
        f"session_id: no Tinker session {session_id[:80]} on this server (it ended long ago, "
        "or the server restarted); start a new ServiceClient"
    )


def _read_record(folder: Path, kind: str | None) -> dict[str, Any]:
    import json

    for name in [RECORDS[kind]] if kind else list(RECORDS.values()):
        try:
            return dict(json.loads((folder / name).read_text()))
        except (OSError, ValueError):
            continue
    return {}


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("releasing a session's models failed: %s", task.exception())
