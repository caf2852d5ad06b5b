"""The Tinker API's root, as the routes call it: it builds the hub and the parts, and answers
the handshake, the futures and the server's capabilities itself. The training clients'
operations are `models` (model_ops.py), the sampling clients' `sampling` (sampling.py);
`weights`, `sessions` and `billing` answer the RestClient and the AdminClient beside them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.engine import Engine

from core.model_names import context_length, known_models
from core.models import RunStatus
from core.settings import Settings
from server.engine.hosts import EngineHosts
from server.errors import Gone, NotFound
from server.tinker_api import schemas
from server.tinker_api.billing import TinkerBilling
from server.tinker_api.downloads import DownloadSigner
from server.tinker_api.model_ops import TinkerModels
from server.tinker_api.sampling import TinkerSampling
from server.tinker_api.schemas import JsonObject
from server.tinker_api.sessions.futures import FutureRegistry, Outcome
from server.tinker_api.sessions.hub import SessionHub, no_session
from server.tinker_api.sessions.records import SessionRecords
from server.tinker_api.sessions.sweeper import SessionSweeper
from server.tinker_api.sessions_view import TinkerSessions
from server.tinker_api.weights import TinkerWeights
from server.tinker_api.worker_client import EngineTinker

log = logging.getLogger(__name__)
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
SAMPLE_CONCURRENCY = 256  # in-flight samples per sampling client (each holds a long poll)


class TinkerService:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        hosts: EngineHosts,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._hub = SessionHub(settings, engine, hosts, clock)
        self.records: SessionRecords = self._hub.records
        self.signer = DownloadSigner()
        self.weights = TinkerWeights(self.records, self.signer)
        self.sessions = TinkerSessions(self._hub, self.signer)
        self.billing = TinkerBilling(self.records)
        self._sweeper = SessionSweeper(self._hub, self.weights.expire)
        self.futures: FutureRegistry = self._hub.futures
        self.worker: EngineTinker = self._hub.worker
        self.models = TinkerModels(self._hub)
        self.sampling = TinkerSampling(self._hub)

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

    # Futures ------------------------------------------------------------------------------

    def cancel_future(self, request_id: str) -> JsonObject:
        if self._hub.futures.get(request_id) is None:
            raise NotFound(f"request_id: {request_id[:120]} is unknown or its result expired")
        return {"cancelled": self._hub.futures.cancel(request_id)}

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
