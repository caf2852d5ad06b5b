"""The sampling clients' operations: open a sampler (from saved weights or a base model),
read it, sample, join it from a cloned client, and the batch poll of its settled samples.
"""

from __future__ import annotations

import asyncio

from core.tinker_wire import OpenSampler, Sample
from server.errors import BadRequest, NotFound
from server.tinker_api import paths, schemas
from server.tinker_api.schemas import JsonObject
from server.tinker_api.sessions import answers
from server.tinker_api.sessions.hub import SessionHub
from server.tinker_api.sessions.session import Sampler

# A cloned SamplingClient (join_sampling_session) numbers its requests from its counter times
# this; retrieve_futures polls each clone apart.
CLONE_SEQ_IDS = 1_000_000_000


class TinkerSampling:
    def __init__(self, hub: SessionHub) -> None:
        self._hub = hub

    async def create_sampling_session(self, body: schemas.CreateSamplerIn) -> JsonObject:
        session = self._hub.session(body.session_id)
        sampler_id = paths.sampler_id(session.id, body.sampling_session_seq_id)
        if sampler_id in session.samplers:  # a retried request
            return {"type": "create_sampling_session", "sampling_session_id": sampler_id}
        if body.model_path:
            folder = await self._hub.checkpoint_folder(body.model_path, "model_path")
            record = await asyncio.to_thread(paths.read_record, folder, None)
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
        await self._hub.place(session, base or None)
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
                request,
                lambda sampled: answers.sampled(session, sampled),
                _poll_target(sampler_id, clone),
                request_id,
            )
            return {"request_id": pending.request_id, "sample_sequence_ids": ids}

        if body.seq_id is None:
            return await submit()
        return await session.once(("sample", sampler_id, body.seq_id), submit)

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

    async def retrieve_futures(self, body: schemas.FuturesIn) -> JsonObject:
        """The sampler's requests settled since the client's cursor (the SDK's batch poller),
        held up to RLCS_TINKER_POLL_HOLD_S (or the client's shorter timeout) for one."""
        target = body.target
        session = self._hub.session(target.sampling_session_id.partition(":sample:")[0])
        if target.sampling_session_id not in session.samplers:
            raise NotFound(
                f"target.sampling_session_id: no sampler {target.sampling_session_id[:100]}"
            )
        hold = self._hub.settings.tinker_poll_hold_s
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


def _poll_target(sampler_id: str, clone: int) -> str:
    return f"{sampler_id}#{clone}"
