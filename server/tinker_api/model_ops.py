"""The training clients' operations: create a model, read its info, forward_backward and
optim_step, save and load its weights, and a server-side custom loss. Each sends its typed
request (core.tinker_wire) through the hub and says how the answer settles the SDK's future.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

from core.checkpoint_check import SAMPLER_KIND, STATE_KIND
from core.tinker_wire import (
    CreateLoss,
    CreateModel,
    ForwardBackward,
    LoadModel,
    LoadState,
    LoraSpec,
    Op,
    OptimStep,
    SaveExternal,
    SaveSampler,
    SaveState,
    Snapshot,
)
from server.errors import BadRequest
from server.tinker_api import paths, schemas
from server.tinker_api.proto_header import ProtoHeaderError, model_and_seq
from server.tinker_api.schemas import JsonObject
from server.tinker_api.sessions import answers
from server.tinker_api.sessions.futures import Outcome
from server.tinker_api.sessions.hub import SessionHub
from server.tinker_api.sessions.session import Model, Sampler, Session
from server.tinker_api.weights import expiry

A = TypeVar("A", bound=BaseModel)


class TinkerModels:
    def __init__(self, hub: SessionHub) -> None:
        self._hub = hub

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
        await self._hub.place(session, body.base_model)
        request = CreateModel(
            model_id=model_id,
            base_model=body.base_model,
            lora=LoraSpec(**lora.model_dump()),
            checkpoint_dir=str(paths.model_folder(session.run_dir, model.seq)),
        )
        reply = {"model_id": model_id, "type": "create_model"}
        pending = await self._hub.submit(
            session, request, lambda ready: answers.model_ready(session, model, ready, reply)
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
            session, model, seq_id, request, lambda out: answers.trained(session, out)
        )

    async def optim_step(self, body: schemas.OptimStepIn) -> JsonObject:
        session, model = self._hub.model(body.model_id)
        params = body.params()
        if params.get("type") != "adam":
            error = f"optim_params: {unserved_optimizer(str(params.get('type')))}"
            return self._hub.failed_now(session, "train", Outcome(error=error), model.model_id)
        request = OptimStep(model_id=model.model_id, params=params)
        return await self._model_op(
            session, model, body.seq_id, request, lambda stepped: answers.stepped(session, stepped)
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
            request,
            lambda saved: answers.saved(session, model, STATE_KIND, name, saved, expires_at),
        )

    async def save_weights_external(self, body: schemas.SaveExternalIn) -> JsonObject:
        """The adapter as a peft folder to download (tinker checkpoint download asks for it)."""
        session, model = self._hub.model(body.model_id)
        if body.age_encryption_recipients:
            return self._hub.failed_now(
                session,
                "save",
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
        sampler_id = paths.sampler_id(session.id, body.sampling_session_seq_id)
        session.add_sampler(Sampler(sampler_id, model.base_model, None))
        reply = {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}
        return await self._model_op(
            session,
            model,
            body.seq_id,
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
            return self._hub.failed_now(session, "load_weights", folder)
        request = LoadState(model_id=model.model_id, folder=str(folder), optimizer=body.optimizer)
        pending = await self._hub.submit(session, request, lambda _: answers.json_outcome(reply))
        return {"request_id": pending.request_id, "model_id": model.model_id}

    async def _load_new(self, session: Session, body: schemas.LoadWeightsIn) -> JsonObject:
        assert body.model_seq_id is not None
        model_id = paths.model_id(session.id, body.model_seq_id)
        folder = await self._hub.state_folder(body.path)
        if isinstance(folder, Outcome):
            return self._hub.failed_now(session, "load_weights", folder, model_id)
        record = await asyncio.to_thread(paths.read_record, folder, STATE_KIND)
        base = body.base_model or str(record.get("base_model", ""))
        rank = (record.get("lora") or {}).get("rank")
        model = Model(model_id, body.model_seq_id, base, rank, body.user_metadata)
        session.add_model(model)
        await self._hub.place(session, base or None)
        reply = {"path": body.path, "model_id": model_id, "type": "load_weights"}
        request = LoadModel(
            model_id=model_id,
            folder=str(folder),
            optimizer=body.optimizer,
            base_model=body.base_model,
            checkpoint_dir=str(paths.model_folder(session.run_dir, model.seq)),
        )
        pending = await self._hub.submit(
            session, request, lambda ready: answers.model_ready(session, model, ready, reply)
        )
        return {"request_id": pending.request_id, "model_id": model_id}

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
                session, request, lambda _: answers.json_outcome(reply)
            )
            return {"request_id": pending.request_id}

        return await session.once(("loss", body.custom_loss_seq_id), submit)

    async def _model_op(
        self,
        session: Session,
        model: Model,
        seq_id: int | None,
        request: Op[A],
        encode: Callable[[A], Outcome],
    ) -> JsonObject:
        """A request on a model, applied once per sequence id (a retry gets its answer)."""

        async def submit() -> JsonObject:
            pending = await self._hub.submit(session, request, encode)
            return {"request_id": pending.request_id, "model_id": model.model_id}

        if seq_id is None:
            return await submit()
        return await session.once((model.model_id, seq_id), submit)


def unserved_optimizer(kind: str) -> str:
    if kind == "dimuon":
        return (
            "Dimuon (DimuonParams, DimuonOptimizerConfig) is not served: Tinker publishes its "
            "step's hyperparameters but not its update (its row and column preconditioner, "
            "matrix-sign iteration and their constants), so it cannot be reproduced here; "
            "use AdamW (AdamParams)"
        )
    return f"optimizer {kind!r} is not served: the local engine implements AdamW (AdamParams)"
