"""The Tinker SDK 0.38's operations, as the routes call them: the handshake, training clients
(create, forward_backward, optim_step, save, load), samplers and sampling, futures and the
server's capabilities. Each sends its typed request (core.tinker_wire) to the Tinker worker
through the hub, and says how the worker's answer settles the SDK's future; a retried POST
(same model and sequence id) gets the first one's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy.engine import Engine

from core.checkpoint_check import RECORDS, SAMPLER_KIND, STATE_KIND
from core.model_names import context_length, known_models
from core.models import RunStatus
from core.settings import Settings
from core.tinker_wire import (
    CreateLoss,
    CreateModel,
    ForwardBackward,
    LoadModel,
    LoadState,
    LoraSpec,
    Op,
    OpenSampler,
    OptimStep,
    Sample,
    SaveExternal,
    SaveSampler,
    SaveState,
    Snapshot,
)
from server.engine.link import EngineLink
from server.errors import BadRequest, Gone, NotFound
from server.tinker_api import paths, schemas
from server.tinker_api.billing import TinkerBilling
from server.tinker_api.downloads import DownloadSigner
from server.tinker_api.proto_header import ProtoHeaderError, model_and_seq
from server.tinker_api.schemas import JsonObject
from server.tinker_api.sessions import answers
from server.tinker_api.sessions.futures import FutureRegistry, Outcome
from server.tinker_api.sessions.hub import SessionHub, no_session
from server.tinker_api.sessions.records import SessionRecords
from server.tinker_api.sessions.session import Model, Sampler, Session
from server.tinker_api.sessions.sweeper import SessionSweeper
from server.tinker_api.sessions_view import TinkerSessions
from server.tinker_api.weights import TinkerWeights, expiry
from server.tinker_api.worker_client import EngineTinker

log = logging.getLogger(__name__)
A = TypeVar("A", bound=BaseModel)
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
# A cloned SamplingClient (join_sampling_session) numbers its requests from its counter times
# this; retrieve_futures polls each clone apart.
CLONE_SEQ_IDS = 1_000_000_000
SAMPLE_CONCURRENCY = 256  # in-flight samples per sampling client (each holds a long poll)


class TinkerService:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        link: EngineLink,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._hub = SessionHub(settings, engine, link, clock)
        self.records: SessionRecords = self._hub.records
        self.signer = DownloadSigner()
        self.weights = TinkerWeights(self.records, self.signer)
        self.sessions = TinkerSessions(self._hub, self.signer)
        self.billing = TinkerBilling(self.records)
        self._sweeper = SessionSweeper(self._hub, self.weights.expire)
        self.futures: FutureRegistry = self._hub.futures
        self.worker: EngineTinker = self._hub.worker

    # Running in the lifespan -------------------------------------------------------------

    async def start(self) -> None:
        await self._sweeper.start()

    async def stop(self) -> None:
        self._sweeper.stop()
        self._hub.close()

    def holds(self, run_id: str) -> bool:
        return self._hub.holds(run_id)

    def request_stop(self, run_id: str) -> None:
        self._sweeper.request_stop(run_id)

    async def sweep(self) -> None:
        await self._sweeper.sweep()

    # Handshake ----------------------------------------------------------------------------

    def client_config(self) -> JsonObject:
        chunk = self._settings.tinker_max_body_bytes // 4  # the SDK's size is an estimate
        return {
            **CLIENT_CONFIG,
            "fwdbwd_max_chunk_bytes_count": min(5_000_000, chunk),
            "sample_max_concurrent_requests": SAMPLE_CONCURRENCY,
        }

    async def create_session(self, body: schemas.CreateSessionIn) -> JsonObject:
        session = await self._hub.open(body.model_dump(mode="json"))
        session.note(f"session started: tinker SDK {body.sdk_version or '?'}")
        log.info("Tinker session %s started", session.id)
        return {"type": "create_session", "session_id": session.id}

    def heartbeat(self, session_id: str) -> JsonObject:
        session = self._hub.sessions.get(session_id)
        if session is None:
            raise Gone(no_session(session_id))  # 410 stops the SDK's heartbeat loop
        if session.ended is not None:
            raise Gone(session.ended)
        session.seen()
        return {"type": "session_heartbeat"}

    async def finish(self, session_id: str, body: schemas.FinishIn) -> JsonObject:
        session = self._hub.sessions.get(session_id)
        if session is None:
            raise NotFound(no_session(session_id))
        if session.ended is None:
            kind = body.reason.type
            detail = f"the script closed its session ({kind})"
            if body.detail:
                detail += f": {body.detail[:2000]}"
            status, failure = {
                "success": (RunStatus.succeeded, None),
                "interrupted": (RunStatus.stopped, None),
            }.get(kind, (RunStatus.failed, "script"))
            self._hub.end(session, status, failure, f"this session was closed ({kind})", detail)
            await self._hub.recorder.written()  # a script that reads its run next sees it ended
        return {}

    # Models -------------------------------------------------------------------------------

    async def create_model(self, body: schemas.CreateModelIn) -> JsonObject:
        session = self._hub.session(body.session_id)
        return await session.once(
            ("model", body.model_seq_id), lambda: self._create_model(session, body)
        )

    async def _create_model(self, session: Session, body: schemas.CreateModelIn) -> JsonObject:
        optimizer = (body.optimizer_config or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise BadRequest(f"optimizer_config: {unserved_optimizer(optimizer)}")
        await self._hub.check_base_model(body.base_model, "base_model")
        model_id = paths.model_id(session.id, body.model_seq_id)
        lora = body.lora_config
        model = Model(model_id, body.model_seq_id, body.base_model, lora.rank, body.user_metadata)
        session.add_model(model)
        request = CreateModel(
            model_id=model_id,
            base_model=body.base_model,
            lora=LoraSpec(**lora.model_dump()),
            checkpoint_dir=str(paths.model_folder(session.run_dir, model.seq)),
        )
        reply = {"model_id": model_id, "type": "create_model"}
        pending = await self._hub.submit(
            session,
            "create_model",
            request,
            lambda ready: answers.model_ready(session, model, ready, reply),
        )
        return {"request_id": pending.request_id, "model_id": model_id}

    def get_info(self, model_id: str) -> JsonObject:
        _, model = self._hub.model(model_id)
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_data": {
                "arch": model.arch,
                "model_name": model.base_model,
                "tokenizer_id": model.tokenizer_id or model.base_model,
            },
            "is_lora": True,
            "lora_rank": model.lora_rank,
            "model_name": model.base_model,
        }

    async def forward_backward(self, body: bytes) -> JsonObject:
        try:
            model_id, seq_id = model_and_seq(body)
        except ProtoHeaderError as exc:
            raise BadRequest(str(exc)) from None
        session, model = self._hub.model(model_id)
        request = ForwardBackward(model_id=model_id, body=body)
        return await self._model_op(
            session, model, seq_id, "train", request, lambda out: answers.trained(session, out)
        )

    async def optim_step(self, body: schemas.OptimStepIn) -> JsonObject:
        session, model = self._hub.model(body.model_id)
        params = body.params()
        if params.get("type") != "adam":
            error = f"optim_params: {unserved_optimizer(str(params.get('type')))}"
            return self._hub.failed_now(session, Outcome(error=error), model.model_id)
        request = OptimStep(model_id=model.model_id, params=params)
        return await self._model_op(
            session,
            model,
            body.seq_id,
            "train",
            request,
            lambda stepped: answers.stepped(session, stepped),
        )

    async def save_weights(self, body: schemas.SaveWeightsIn) -> JsonObject:
        session, model = self._hub.model(body.model_id)
        expires_at = expiry(body.ttl_seconds, "ttl_seconds")
        name = body.path or f"state-{session.step:06d}"
        request = SaveState(
            model_id=model.model_id,
            name=name,
            overwrite=body.overwrite,
            user_metadata=body.user_metadata,
        )
        return await self._model_op(
            session,
            model,
            body.seq_id,
            "save",
            request,
            lambda saved: answers.saved(session, model, STATE_KIND, name, saved, expires_at),
        )

    async def save_weights_external(self, body: schemas.SaveExternalIn) -> JsonObject:
        """The adapter as a peft folder to download (tinker checkpoint download asks for it)."""
        session, model = self._hub.model(body.model_id)
        if body.age_encryption_recipients:
            return self._hub.failed_now(
                session,
                Outcome(
                    error="age_encryption_recipients: not served: this server has no age "
                    "implementation to encrypt the files with; export without recipients (the "
                    "files stay on this machine, and their URLs are signed)",
                    category="user",
                ),
                model.model_id,
            )
        expires_at = expiry(body.ttl_seconds, "ttl_seconds")
        request = SaveExternal(model_id=model.model_id, name=body.path)
        return await self._model_op(
            session,
            model,
            body.seq_id,
            "save",
            request,
            lambda saved: answers.saved(
                session, model, paths.EXTERNAL_KIND, body.path, saved, expires_at
            ),
        )

    async def save_weights_for_sampler(self, body: schemas.SaveSamplerIn) -> JsonObject:
        session, model = self._hub.model(body.model_id)
        if body.path:
            name = body.path
            expires_at = expiry(body.ttl_seconds, "ttl_seconds")
            request = SaveSampler(
                model_id=model.model_id, name=name, user_metadata=body.user_metadata
            )
            return await self._model_op(
                session,
                model,
                body.seq_id,
                "save",
                request,
                lambda saved: answers.saved(session, model, SAMPLER_KIND, name, saved, expires_at),
            )
        # No name: a sampler over the weights as they are (save_weights_and_get_sampling_
        # client); "inflight" is served as a snapshot.
        if body.sampling_session_seq_id is None:
            raise BadRequest(
                "sampling_session_seq_id: a save_weights_for_sampler without a name (path) "
                "makes a sampler and needs its sequence id"
            )
        sampler_id = _sampler_id(session.id, body.sampling_session_seq_id)
        session.add_sampler(Sampler(sampler_id, model.base_model, None))
        reply = {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}
        return await self._model_op(
            session,
            model,
            body.seq_id,
            "save",
            Snapshot(model_id=model.model_id, sampler_id=sampler_id),
            lambda _: answers.json_outcome(reply),
        )

    async def load_weights(self, body: schemas.LoadWeightsIn) -> JsonObject:
        if body.model_id:  # the deprecated form: into an existing model
            session, model = self._hub.model(body.model_id)
            return await session.once(
                (model.model_id, body.seq_id), lambda: self._load_into(session, model, body)
            )
        if body.session_id is None or body.model_seq_id is None:
            raise BadRequest(
                "load_weights: name the model (model_id and seq_id), or the new model's "
                "session_id and model_seq_id"
            )
        session = self._hub.session(body.session_id)
        return await session.once(
            ("model", body.model_seq_id), lambda: self._load_new(session, body)
        )

    async def _load_into(
        self, session: Session, model: Model, body: schemas.LoadWeightsIn
    ) -> JsonObject:
        reply = {"path": body.path, "model_id": model.model_id, "type": "load_weights"}
        folder = await self._hub.state_folder(body.path)
        if isinstance(folder, Outcome):
            return self._hub.failed_now(session, folder)
        request = LoadState(model_id=model.model_id, folder=str(folder), optimizer=body.optimizer)
        pending = await self._hub.submit(
            session, "load_weights", request, lambda _: answers.json_outcome(reply)
        )
        return {"request_id": pending.request_id, "model_id": model.model_id}

    async def _load_new(self, session: Session, body: schemas.LoadWeightsIn) -> JsonObject:
        assert body.model_seq_id is not None
        model_id = paths.model_id(session.id, body.model_seq_id)
        folder = await self._hub.state_folder(body.path)
        if isinstance(folder, Outcome):
            return self._hub.failed_now(session, folder, model_id)
        record = await asyncio.to_thread(_read_record, folder, STATE_KIND)
        base = body.base_model or str(record.get("base_model", ""))
        rank = (record.get("lora") or {}).get("rank")
        model = Model(model_id, body.model_seq_id, base, rank, body.user_metadata)
        session.add_model(model)
        reply = {"path": body.path, "model_id": model_id, "type": "load_weights"}
        request = LoadModel(
            model_id=model_id,
            folder=str(folder),
            optimizer=body.optimizer,
            base_model=body.base_model,
            checkpoint_dir=str(paths.model_folder(session.run_dir, model.seq)),
        )
        pending = await self._hub.submit(
            session,
            "load_weights",
            request,
            lambda ready: answers.model_ready(session, model, ready, reply),
        )
        return {"request_id": pending.request_id, "model_id": model_id}

    async def _model_op(
        self,
        session: Session,
        model: Model,
        seq_id: int | None,
        kind: str,
        request: Op[A],
        encode: Callable[[A], Outcome],
    ) -> JsonObject:
        """A request on a model, applied once per sequence id (a retry gets its answer)."""

        async def submit() -> JsonObject:
            pending = await self._hub.submit(session, kind, request, encode)
            return {"request_id": pending.request_id, "model_id": model.model_id}

        if seq_id is None:
            return await submit()
        return await session.once((model.model_id, seq_id), submit)

    # Sampling -----------------------------------------------------------------------------

    async def create_sampling_session(self, body: schemas.CreateSamplerIn) -> JsonObject:
        session = self._hub.session(body.session_id)
        sampler_id = _sampler_id(session.id, body.sampling_session_seq_id)
        if sampler_id in session.samplers:  # a retried request
            return {"type": "create_sampling_session", "sampling_session_id": sampler_id}
        if body.model_path:
            folder = await self._hub.checkpoint_folder(body.model_path, "model_path")
            record = await asyncio.to_thread(_read_record, folder, None)
            base = str(record.get("base_model", ""))
            request = OpenSampler(sampler_id=sampler_id, folder=str(folder))
        elif body.base_model:
            await self._hub.check_base_model(body.base_model, "base_model")
            base = body.base_model
            request = OpenSampler(sampler_id=sampler_id, base_model=body.base_model)
        else:
            raise BadRequest(
                "create_sampling_session: give model_path (a tinker:// path that "
                "save_weights_for_sampler returned) or base_model"
            )
        await self._hub.call(session, request)  # it loads meanwhile; samples asked wait for it
        session.add_sampler(Sampler(sampler_id, base, body.model_path))
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def sampler(self, sampler_id: str) -> JsonObject:
        session = self._hub.session(sampler_id.partition(":sample:")[0])
        sampler = session.samplers.get(sampler_id)
        if sampler is None:
            raise NotFound(f"sampler_id: no sampler {sampler_id[:100]} in this session")
        return {
            "sampler_id": sampler.sampler_id,
            "base_model": sampler.base_model,
            "model_path": sampler.model_path,
        }

    async def asample(self, body: schemas.SampleIn) -> JsonObject:
        if not body.sampling_session_id:
            raise BadRequest(
                "sampling_session_id: missing; sample through a sampling client (from "
                "create_sampling_client or save_weights_and_get_sampling_client)"
            )
        sampler_id = body.sampling_session_id
        session = self._hub.session(sampler_id.partition(":sample:")[0])
        if sampler_id not in session.samplers:
            raise NotFound(f"sampling_session_id: no sampler {sampler_id[:100]} in this session")

        async def submit() -> JsonObject:
            # The samples' ids are fixed now (the SDK wants them with this answer): the
            # request's, which start with the session's (recorded sequences are its own).
            request_id = self._hub.futures.new_id(session.id, "sample")
            ids = [f"{request_id}:{i}" for i in range(body.num_samples)]
            request = Sample(
                sampler_id=sampler_id,
                sequence_ids=ids,
                record_stability_info=bool(body.record_stability_info),
                **body.model_dump(
                    mode="json",
                    exclude={
                        "sampling_session_id",
                        "seq_id",
                        "base_model",
                        "model_path",
                        "record_stability_info",
                    },
                ),
            )
            clone = (body.seq_id or 0) // CLONE_SEQ_IDS
            pending = await self._hub.submit(
                session,
                "sample",
                request,
                lambda sampled: answers.sampled(session, sampled),
                _poll_target(sampler_id, clone),
                request_id,
            )
            return {"request_id": pending.request_id, "sample_sequence_ids": ids}

        if body.seq_id is None:
            return await submit()
        return await session.once(("sample", sampler_id, body.seq_id), submit)

    async def create_custom_loss(self, body: schemas.CreateLossIn) -> JsonObject:
        """A server-side custom loss: the worker rebuilds its graph from the operations it
        allows (refusing the first it does not, naming it); its id names it in
        forward_backward(..., "custom", {"loss_id": ...}) of this session's models."""
        session = self._hub.session(body.session_id)

        async def submit() -> JsonObject:
            loss_id = f"{session.id}:loss:{body.custom_loss_seq_id}"
            request = CreateLoss(
                loss_id=loss_id, name=body.name, inputs=body.inputs, graph=body.graph
            )
            reply = {"loss_id": loss_id, "type": "create_custom_loss"}
            pending = await self._hub.submit(
                session, "create_custom_loss", request, lambda _: answers.json_outcome(reply)
            )
            return {"request_id": pending.request_id}

        return await session.once(("loss", body.custom_loss_seq_id), submit)

    async def join_sampling_session(self, body: schemas.JoinSamplerIn) -> JsonObject:
        """A new client of an existing sampler (a SamplingClient cloned into another
        process): its own counter, which the SDK folds into its requests' sequence ids."""
        session = self._hub.session(body.sampling_session_id.partition(":sample:")[0])
        sampler = session.samplers.get(body.sampling_session_id)
        if sampler is None:
            raise NotFound(
                f"sampling_session_id: no sampler {body.sampling_session_id[:100]} in this session"
            )
        sampler.clients += 1
        return {"type": "join_sampling_session", "client_counter": sampler.clients}

    # Futures ------------------------------------------------------------------------------

    def cancel_future(self, request_id: str) -> JsonObject:
        if self._hub.futures.get(request_id) is None:
            raise NotFound(f"request_id: {request_id[:120]} is unknown or its result expired")
        return {"cancelled": self._hub.futures.cancel(request_id)}

    async def retrieve_futures(self, body: schemas.FuturesIn) -> JsonObject:
        """The sampler's requests settled since the client's cursor (the SDK's batch poller),
        held up to RLCS_TINKER_POLL_HOLD_S (or the client's shorter timeout) for one."""
        target = body.target
        session = self._hub.session(target.sampling_session_id.partition(":sample:")[0])
        if target.sampling_session_id not in session.samplers:
            raise NotFound(
                f"target.sampling_session_id: no sampler {target.sampling_session_id[:100]}"
            )
        hold = self._settings.tinker_poll_hold_s
        if body.timeout is not None:
            hold = max(0.0, min(hold, body.timeout))
        with session.busy():
            found, cursor = await self._hub.futures.completions(
                _poll_target(target.sampling_session_id, target.cloned_sampler_id),
                body.prev_cursor,
                hold,
                body.retrieved_request_ids,
            )
        completions = [
            {"state": "failed", "request_id": c.request_id}
            if c.failed
            else {"state": "finished", "request_id": c.request_id}
            for c in found
        ]
        return {"completions": completions, "cursor": cursor}

    async def retrieve(
        self, body: schemas.RetrieveIn, gone: Callable[[], Awaitable[bool]] | None = None
    ) -> Outcome | JsonObject:
        pending = self._hub.futures.get(body.request_id)
        if pending is None:
            # 410: the SDK sends a sampling request again; a training one it reports.
            raise Gone(
                f"request_id: {body.request_id[:120]} is unknown or its result expired (results "
                f"are kept {self._settings.tinker_future_ttl_s:.0f} s, and not across a server "
                "restart)"
            )
        session = self._hub.sessions.get(pending.session_id)
        hold = self._settings.tinker_poll_hold_s
        with session.busy() if session is not None else contextlib.nullcontext():
            outcome = await self._hub.futures.wait(body.request_id, hold, gone)
        if outcome is None:
            return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
        return outcome

    # Capabilities -------------------------------------------------------------------------

    def capabilities(self) -> JsonObject:
        names = list(known_models())
        for session in self._hub.sessions.values():
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


def unserved_optimizer(kind: str) -> str:
    if kind == "dimuon":
        return (
            "Dimuon (DimuonParams, DimuonOptimizerConfig) is not served: Tinker publishes its "
            "step's hyperparameters but not its update (its row and column preconditioner, "
            "matrix-sign iteration and their constants), so it cannot be reproduced here; "
            "use AdamW (AdamParams)"
        )
    return f"optimizer {kind!r} is not served: the local engine implements AdamW (AdamParams)"


def _poll_target(sampler_id: str, clone: int) -> str:
    return f"{sampler_id}#{clone}"


def _sampler_id(session_id: str, seq: int) -> str:
    return f"{session_id}:sample:{seq}"


def _read_record(folder: Path, kind: str | None) -> dict[str, Any]:
    for name in [RECORDS[kind]] if kind else list(RECORDS.values()):
        try:
            return dict(json.loads((folder / name).read_text()))
        except (OSError, ValueError):
            continue
    return {}
