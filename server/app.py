"""The FastAPI application: `create_app(settings)` wires services in a lifespan.

`app = create_app()` is what `uvicorn server.app:app` serves. Nothing heavy (torch,
transformers, tinker, wandb) is imported here or by anything this imports at start-up.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException
from starlette.routing import Route

from core.db import make_engine
from core.model_names import context_length
from core.models import utcnow
from core.schema import upgrade as upgrade_schema
from core.settings import PROJECT_ROOT, Settings
from server import __version__
from server.container import Services
from server.engine import routes as engine_routes
from server.engine.hosts import EngineHosts
from server.engine.room import EngineRoom
from server.engine.service import EngineService
from server.environments import routes as environment_routes
from server.environments.catalog import Catalog
from server.environments.configs import ConfigService
from server.environments.inspector import Inspectors
from server.environments.model_check import ModelCheck
from server.environments.verifiers.deps import DependencyInstaller
from server.errors import DomainError, headers_for, status_for
from server.guards.access import LoopbackUnlessToken, insecure_warning, require_token
from server.guards.validation import (
    FASTAPI_UNREADABLE_BODY,
    unreadable_body,
    validation_detail,
)
from server.guards.web import BodyLimit, WebGuard
from server.health import routes as health_routes
from server.inference import routes as inference_routes
from server.inference.service import InferenceService
from server.inference.worker import InferenceWorker
from server.launch.supervisor import Supervisor
from server.mcp.endpoint import McpEndpoint, serve_mcp
from server.openai_compat import errors as openai_errors
from server.openai_compat import routes as openai_routes
from server.openai_compat.chat import ChatService
from server.openai_compat.chat_models import ChatModels
from server.runs import export_routes, rollout_routes
from server.runs import routes as run_routes
from server.runs.export import ExportService
from server.runs.forks import ForkService
from server.runs.logs import StreamSlots, bind_sse_to_this_loop
from server.runs.metrics import MetricsService
from server.runs.rollouts import RolloutService
from server.runs.service import RunService
from server.runs.views import RunViews
from server.runs.wandb_reader import WandbReader
from server.schemas import ErrorOut
from server.sweeps import routes as sweep_routes
from server.sweeps.service import SweepService
from server.tinker_api import routes as tinker_routes
from server.tinker_api.launcher import TinkerLauncher
from server.tinker_api.rest import TinkerRest
from server.tinker_api.service import TinkerService
from server.webhooks import routes as webhook_routes
from server.webhooks.dispatch import WebhookDispatcher
from server.webhooks.fanout import FanOut
from server.webhooks.service import WebhookService
from server.webhooks.signing import signing_key

log = logging.getLogger("server")
ERROR_CODES = ("400", "401", "403", "404", "409", "410", "413", "415", "422", "429", "503")


def build_services(settings: Settings) -> Services:
    engine = _open_database(settings)
    catalog = _catalog(settings)
    models = ModelCheck.from_settings(settings)
    configs = ConfigService(engine, catalog, models)
    metrics = MetricsService(engine, WandbReader.from_settings(settings))
    hosts = EngineHosts(settings)
    supervisor = Supervisor(settings, engine, EngineRoom(settings).wait_reason)
    runs = RunService(settings, engine, configs, metrics, supervisor.launchers, supervisor.wake)
    worker = InferenceWorker(settings, hosts)
    inference = InferenceService(settings, engine, configs, runs, worker, models)
    sweeps = SweepService(runs, configs, metrics)
    hooks = WebhookService(settings, engine, signing_key(settings))
    fanout = FanOut(engine, RunViews(settings, metrics), utcnow, sweep_view=sweeps.get)
    dispatch = WebhookDispatcher(settings, engine, supervisor.leadership, fanout, hooks.secret)
    tinker = TinkerService(settings, engine, hosts)
    rollouts = RolloutService(engine, runs)
    supervisor.launchers.register(TinkerLauncher(engine, tinker))
    return Services(
        settings=settings,
        engine=engine,
        catalog=catalog,
        configs=configs,
        metrics=metrics,
        runs=runs,
        supervisor=supervisor,
        inference=inference,
        streams=StreamSlots(settings.max_streams_per_client),
        sweeps=sweeps,
        forks=ForkService(runs, configs),
        export=ExportService(settings, runs, metrics, rollouts),
        rollouts=rollouts,
        chat=_chat(settings, engine, configs, inference, models, worker),
        webhooks=hooks,
        webhook_dispatch=dispatch,
        tinker=tinker,
        tinker_rest=TinkerRest(tinker.records),
        engine_hosts=hosts,
        engine_status=EngineService(settings, hosts.slots),
    )


def _open_database(settings: Settings) -> Engine:
    """The server's folders and database, its schema brought up to date."""
    settings.var_dir.mkdir(parents=True, exist_ok=True)
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url, settings.db_busy_timeout_s)
    upgrade_schema(engine)
    return engine


def _chat(
    settings: Settings,
    engine: Engine,
    configs: ConfigService,
    inference: InferenceService,
    models: ModelCheck,
    worker: InferenceWorker,
) -> ChatService:
    """The OpenAI-compatible chat: its model listing and the worker that decodes."""
    listing = ChatModels(
        engine,
        configs,
        inference,
        models,
        context=lambda name: context_length(name, settings.models_dir),
    )
    return ChatService(settings, listing, worker)


def _catalog(settings: Settings) -> Catalog:
    return Catalog(
        settings.environment_dirs,
        PROJECT_ROOT,
        Inspectors(settings),
        dependencies=DependencyInstaller.from_settings(settings),
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(
        title="RL control server",
        version=__version__,
        description="Discover RL environments, edit their config, run and watch LoRA training.",
        lifespan=_lifespan(settings),
    )
    app.state.settings = settings
    _add_guards(app, settings)
    _add_error_handlers(app)
    _add_routes(app, settings)
    _document_errors(app)
    openai_errors.install(app)  # errors on /v1 in OpenAI's shape
    return app


def _lifespan(settings: Settings) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Build the services at start-up and start their background work; stop and close it all
    at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.api_token is None and settings.insecure_no_token:
            log.warning("!" * 20 + " %s " + "!" * 20, insecure_warning())
        bind_sse_to_this_loop()
        svc = build_services(settings)
        app.state.services = svc
        await svc.tinker.start()
        await svc.supervisor.start()
        await svc.webhook_dispatch.start()
        svc.metrics.start()
        svc.inference.warm_up()
        try:
            async with serve_mcp(app, svc):
                yield
        finally:
            await svc.tinker.stop()
            await svc.webhook_dispatch.stop()
            await svc.supervisor.stop()
            svc.inference.worker.stop()
            svc.engine_hosts.close()
            svc.catalog.close()
            svc.metrics.close()
            svc.engine.dispose()

    return lifespan


def _add_guards(app: FastAPI, settings: Settings) -> None:
    # The last added runs first: peer check, then Host/Origin/JSON checks, then the body cap.
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(BodyLimit, settings=settings)
    app.add_middleware(WebGuard, settings=settings)
    app.add_middleware(LoopbackUnlessToken, settings=settings)


def _add_error_handlers(app: FastAPI) -> None:
    # Starlette types a handler as taking any Exception; each of ours takes the class it is
    # registered for, which is all it is ever given (hence the ignores).
    app.add_exception_handler(DomainError, _domain_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(OperationalError, _database_busy)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]


def _add_routes(app: FastAPI, settings: Settings) -> None:
    """Every domain's routes: behind the bearer token but for health, the dashboard's files,
    the Tinker SDK's API and MCP, which check their own way (or need none)."""
    app.include_router(health_routes.router)
    # The dashboard's scripts, styles and vendored chart library: no data in them, no token.
    app.mount("/static", StaticFiles(directory=health_routes.STATIC), name="static")
    protected = [Depends(require_token)]
    app.include_router(environment_routes.router, dependencies=protected)
    app.include_router(run_routes.router, dependencies=protected)
    app.include_router(export_routes.router, dependencies=protected)
    app.include_router(rollout_routes.router, dependencies=protected)
    app.include_router(sweep_routes.router, dependencies=protected)
    app.include_router(webhook_routes.router, dependencies=protected)
    app.include_router(
        inference_routes.router_for(settings.inference_max_prompts), dependencies=protected
    )
    app.include_router(openai_routes.router, dependencies=protected)
    app.include_router(openai_routes.inference_router, dependencies=protected)
    app.include_router(engine_routes.router, dependencies=protected)
    # The Tinker SDK's API: it checks the SDK's key (X-API-Key) instead of our bearer token.
    app.include_router(tinker_routes.router)
    app.include_router(tinker_routes.downloads)
    # MCP (streamable HTTP); the endpoint checks the token itself, before any MCP handling.
    # A Route, not app.add_route: that one is typed for request handlers, and this is an ASGI app.
    app.router.routes.append(Route("/mcp", McpEndpoint(), include_in_schema=False))


async def _domain_error(_request: Request, exc: DomainError) -> JSONResponse:
    return JSONResponse(
        {"detail": exc.detail, **exc.extra}, status_code=status_for(exc), headers=headers_for(exc)
    )


async def _database_busy(_request: Request, exc: OperationalError) -> JSONResponse:
    """A database locked past the busy timeout (or unreachable) is a retry, not a 500."""
    log.warning("database unavailable: %s", str(exc.orig)[:200])
    locked = "locked" in str(exc.orig).lower() or "busy" in str(exc.orig).lower()
    why = "another writer holds its lock" if locked else "it cannot be reached"
    return JSONResponse(
        {"detail": f"The database is busy ({why}). Retry in a few seconds."},
        status_code=503,
        headers={"Retry-After": "2"},
    )


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """A body FastAPI could not decode is malformed JSON, answered as such (in OpenAI's shape
    on /v1); every other HTTP error as FastAPI answers it."""
    if exc.status_code == 400 and exc.detail == FASTAPI_UNREADABLE_BODY:
        handler = request.app.exception_handlers[RequestValidationError]
        response: Response = await handler(request, unreadable_body())
        return response
    return await http_exception_handler(request, exc)


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """One readable sentence naming each bad field, instead of FastAPI's list of dicts."""
    return JSONResponse({"detail": validation_detail(exc.errors())}, status_code=422)


def _document_errors(app: FastAPI) -> None:
    """Declare our error body ({"detail": str}) in the OpenAPI document for every route."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        error_ref = {"$ref": "#/components/schemas/Error"}
        schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = (
            ErrorOut.model_json_schema()
        )
        for path_item in schema.get("paths", {}).values():
            for operation in path_item.values():
                responses = operation.setdefault("responses", {})
                for code in ERROR_CODES:
                    responses[code] = {
                        "description": "Error: what is wrong and how to fix it",
                        "content": {"application/json": {"schema": error_ref}},
                    }
        schema["components"]["schemas"].pop("HTTPValidationError", None)
        schema["components"]["schemas"].pop("ValidationError", None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


app = create_app()
