"""The Tinker SDK 0.38's HTTP API under /api/v1 (thin: TinkerService and TinkerRest answer).

Every route checks the SDK's key (X-API-Key) instead of our bearer token. Errors keep our
shape ({"detail": ...}); a failed request whose cause is the caller's input is a failed
future with category "user", not an HTTP error (a 4xx on a POST poisons the SDK's client).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import FileResponse

from server.errors import BadRequest
from server.tinker_api import schemas
from server.tinker_api.auth import check_key
from server.tinker_api.deps import tinker_rest, tinker_service
from server.tinker_api.rest import TinkerRest
from server.tinker_api.schemas import JsonObject
from server.tinker_api.service import TinkerService
from server.tinker_api.sessions.futures import Outcome

PROTOBUF = "application/x-protobuf"


def tinker_key(request: Request) -> None:
    check_key(request.app.state.settings, request.headers.get("x-api-key"))


router = APIRouter(prefix="/api/v1", tags=["tinker"], dependencies=[Depends(tinker_key)])


Tk = Annotated[TinkerService, Depends(tinker_service)]
Rest = Annotated[TinkerRest, Depends(tinker_rest)]


# Handshake and housekeeping ----------------------------------------------------------------


@router.post("/client/config")
async def client_config(tk: Tk) -> JsonObject:
    return tk.client_config()


@router.post("/client/dynamic_config")
async def dynamic_config() -> JsonObject:
    return {}


@router.get("/healthz")
async def healthz() -> JsonObject:
    return {"status": "ok"}


@router.post("/create_session")
async def create_session(body: schemas.CreateSessionIn, tk: Tk) -> JsonObject:
    return await tk.create_session(body)


@router.post("/session_heartbeat")
async def session_heartbeat(body: schemas.SessionIn, tk: Tk) -> JsonObject:
    return tk.heartbeat(body.session_id)


@router.post("/telemetry")
async def telemetry() -> JsonObject:
    return {"status": "accepted"}  # not kept: the SDK's telemetry is for its own service


@router.post("/sessions/{session_id}/finish")
async def finish_session(session_id: str, body: schemas.FinishIn, tk: Tk) -> JsonObject:
    return await tk.finish(session_id, body)


# Training ----------------------------------------------------------------------------------


@router.post("/create_model")
async def create_model(body: schemas.CreateModelIn, tk: Tk) -> JsonObject:
    return await tk.models.create_model(body)


@router.post("/get_info")
async def get_info(body: schemas.ModelIn, tk: Tk) -> JsonObject:
    return tk.models.get_info(body.model_id)


@router.post("/forward_backward")
async def forward_backward(request: Request, tk: Tk) -> JsonObject:
    kind = request.headers.get("content-type", "")
    if PROTOBUF not in kind:
        raise BadRequest(
            f"body: forward_backward takes a protobuf ForwardBackwardRequest ({PROTOBUF}), as "
            f"the tinker SDK 0.38 sends it; got {kind or 'no content type'}"
        )
    if request.headers.get("content-encoding", "identity").lower() not in ("", "identity"):
        raise BadRequest("body: send it uncompressed (this server's client/config asks for that)")
    return await tk.models.forward_backward(await request.body())


@router.post("/optim_step")
async def optim_step(body: schemas.OptimStepIn, tk: Tk) -> JsonObject:
    return await tk.models.optim_step(body)


@router.post("/save_weights")
async def save_weights(body: schemas.SaveWeightsIn, tk: Tk) -> JsonObject:
    return await tk.models.save_weights(body)


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(body: schemas.SaveSamplerIn, tk: Tk) -> JsonObject:
    return await tk.models.save_weights_for_sampler(body)


@router.post("/save_weights_external")
async def save_weights_external(body: schemas.SaveExternalIn, tk: Tk) -> JsonObject:
    return await tk.models.save_weights_external(body)


@router.post("/load_weights")
async def load_weights(body: schemas.LoadWeightsIn, tk: Tk) -> JsonObject:
    return await tk.models.load_weights(body)


# Sampling ----------------------------------------------------------------------------------


@router.post("/create_sampling_session")
async def create_sampling_session(body: schemas.CreateSamplerIn, tk: Tk) -> JsonObject:
    return await tk.sampling.create_sampling_session(body)


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, tk: Tk) -> JsonObject:
    return tk.sampling.sampler(sampler_id)


@router.post("/asample")
async def asample(body: schemas.SampleIn, tk: Tk) -> JsonObject:
    return await tk.sampling.asample(body)


@router.post("/join_sampling_session")
async def join_sampling_session(body: schemas.JoinSamplerIn, tk: Tk) -> JsonObject:
    return await tk.sampling.join_sampling_session(body)


# Futures -----------------------------------------------------------------------------------


@router.post("/retrieve_future", response_model=None)
async def retrieve_future(
    body: schemas.RetrieveIn, request: Request, tk: Tk
) -> Response | JsonObject:
    # A held poll ends early when its client goes away (a killed script's socket closes).
    outcome = await tk.retrieve(body, request.is_disconnected)
    if not isinstance(outcome, Outcome):
        return outcome  # try_again
    if outcome.error is not None:
        return {"error": outcome.error, "category": outcome.category}
    return Response(outcome.body, media_type=outcome.content_type)


@router.post("/retrieve_futures")
async def retrieve_futures(body: schemas.FuturesIn, tk: Tk) -> JsonObject:
    return await tk.sampling.retrieve_futures(body)


@router.post("/cancel_future")
def cancel_future(body: schemas.CancelIn, tk: Tk) -> JsonObject:
    return tk.cancel_future(body.request_id)


@router.post("/create_custom_loss")
async def create_custom_loss(body: schemas.CreateLossIn, tk: Tk) -> JsonObject:
    return await tk.models.create_custom_loss(body)


# The RestClient ----------------------------------------------------------------------------


@router.get("/get_server_capabilities")
def get_server_capabilities(tk: Tk) -> JsonObject:
    return tk.capabilities()


@router.get("/training_runs")
def list_training_runs(
    rest: Rest,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JsonObject:
    return rest.training_runs(limit, offset)


@router.get("/training_runs/{model_id}")
def get_training_run(model_id: str, rest: Rest) -> JsonObject:
    return rest.training_run(model_id)


@router.get("/training_runs/{model_id}/checkpoints")
def list_checkpoints(model_id: str, rest: Rest) -> JsonObject:
    return rest.checkpoints(model_id)


# Before the DELETE of a checkpoint, whose path would take these suffixes in.
@router.get("/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/external_weights_urls")
def external_weights_urls(
    model_id: str, checkpoint_id: str, request: Request, tk: Tk
) -> JsonObject:
    return tk.weights.external_urls(model_id, checkpoint_id, str(request.base_url))


@router.put("/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/ttl")
def set_checkpoint_ttl(model_id: str, checkpoint_id: str, body: schemas.TtlIn, tk: Tk) -> None:
    tk.weights.set_ttl(model_id, checkpoint_id, body.ttl_seconds)


@router.post("/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/publish")
def publish_checkpoint(model_id: str, checkpoint_id: str, tk: Tk) -> None:
    tk.weights.publish(model_id, checkpoint_id, True)


@router.delete("/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/publish")
def unpublish_checkpoint(model_id: str, checkpoint_id: str, tk: Tk) -> None:
    tk.weights.publish(model_id, checkpoint_id, False)


@router.post("/copy_weights")
def copy_weights(
    body: schemas.CopyWeightsIn,
    tk: Tk,
    idempotency_key: Annotated[
        str | None, Header(alias="X-Idempotency-Key", max_length=100)
    ] = None,
) -> JsonObject:
    return tk.weights.copy(body, idempotency_key)


@router.delete("/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
def delete_checkpoint(model_id: str, checkpoint_id: str, rest: Rest) -> JsonObject:
    rest.delete_checkpoint(model_id, checkpoint_id)
    return {}


@router.get("/checkpoints")
def list_user_checkpoints(
    rest: Rest,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JsonObject:
    return rest.user_checkpoints(limit, offset)


@router.post("/weights_info")
def weights_info(body: schemas.WeightsInfoIn, rest: Rest) -> JsonObject:
    return rest.weights_info(body.tinker_path)


# Signed downloads: a plain GET with no key, as the SDK's command line fetches them ------------

downloads = APIRouter(prefix="/api/v1/downloads", tags=["tinker"])


@downloads.get("/traces/{session_id}")
def download_trace(
    session_id: str,
    tk: Tk,
    expires: Annotated[int, Query()],
    signature: Annotated[str, Query(max_length=128)],
) -> JsonObject:
    return tk.sessions.trace_file(session_id, expires, signature)


@downloads.get("/{model_id}/{name}/{file}", response_model=None)
def download_file(
    model_id: str,
    name: str,
    file: str,
    tk: Tk,
    expires: Annotated[int, Query()],
    signature: Annotated[str, Query(max_length=128)],
) -> FileResponse:
    path = tk.weights.download(model_id, name, file, expires, signature)
    return FileResponse(path, media_type="application/octet-stream", filename=file)


@router.get("/sessions")
def list_sessions(
    tk: Tk,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JsonObject:
    return tk.sessions.list(limit, offset)


@router.post("/sessions/search")
def search_sessions(body: schemas.SessionSearchIn, tk: Tk) -> JsonObject:
    return tk.sessions.search(body)


@router.get("/sessions/{session_id}")
def get_session(session_id: str, tk: Tk) -> JsonObject:
    return tk.sessions.get(session_id)


@router.put("/sessions/{session_id}/project")
def assign_session_project(session_id: str, body: schemas.ProjectIn, tk: Tk) -> None:
    tk.sessions.set_project(session_id, body.project_id)


@router.get("/sessions/{session_id}/trace_export")
def export_session_trace(session_id: str, request: Request, tk: Tk) -> JsonObject:
    return tk.sessions.trace_export(session_id, str(request.base_url))


# Billing (the AdminClient) ------------------------------------------------------------------


@router.get("/billing/usage/events")
def billing_usage(
    tk: Tk, starting_on: Annotated[datetime, Query()], ending_before: Annotated[datetime, Query()]
) -> JsonObject:
    return tk.billing.usage(starting_on, ending_before)


@router.get("/billing/usage/checkpoints/current")
def checkpoint_storage(
    tk: Tk, project_id: Annotated[str | None, Query(max_length=200)] = None
) -> JsonObject:
    return tk.billing.checkpoint_storage(project_id)
