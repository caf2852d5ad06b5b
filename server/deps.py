"""Dependencies shared by routes: the service container and the bearer-token check (the admin
token may do anything; read tokens may list and watch)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from sqlalchemy.engine import Engine

from core.settings import Settings
from server.engine.hosts import EngineHosts
from server.engine.service import EngineService
from server.environments.catalog import Catalog
from server.environments.configs import ConfigService
from server.errors import Forbidden, Unauthorized
from server.guards.access import token_matches
from server.guards.web import SAFE_METHODS
from server.inference.service import InferenceService
from server.launch.supervisor import Supervisor
from server.openai_compat.chat import ChatService
from server.runs.export import ExportService
from server.runs.forks import ForkService
from server.runs.logs import StreamSlots
from server.runs.metrics import MetricsService
from server.runs.rollouts import RolloutService
from server.runs.service import RunService
from server.sweeps.service import SweepService
from server.tinker_api.rest import TinkerRest
from server.tinker_api.service import TinkerService
from server.webhooks.dispatch import WebhookDispatcher
from server.webhooks.service import WebhookService


@dataclass
class Services:
    settings: Settings
    engine: Engine
    catalog: Catalog
    configs: ConfigService
    metrics: MetricsService
    runs: RunService
    supervisor: Supervisor
    inference: InferenceService
    streams: StreamSlots
    sweeps: SweepService
    webhooks: WebhookService
    webhook_dispatch: WebhookDispatcher
    forks: ForkService
    export: ExportService
    rollouts: RolloutService
    chat: ChatService
    tinker: TinkerService
    tinker_rest: TinkerRest
    engine_hosts: EngineHosts
    engine_status: EngineService


def services(request: Request) -> Services:
    svc: Services = request.app.state.services  # set by the app's lifespan
    return svc


def require_token(request: Request) -> None:
    settings = request.app.state.settings
    token = settings.api_token
    if token is None:
        return
    given = request.headers.get("authorization", "")
    if token_matches(given, token.get_secret_value()):
        return
    # Every read token is compared (no early exit), each in constant time.
    read_only = [token_matches(given, t) for t in settings.read_token_values]
    if not any(read_only):
        raise Unauthorized(
            "Missing or wrong token: send the header 'Authorization: Bearer <RLCS_API_TOKEN>'."
        )
    if request.method not in SAFE_METHODS:
        raise Forbidden(
            f"This token is read-only (scope: read): it may list and watch runs but not "
            f"{request.method} {request.url.path} (start, stop, resume, select, edit or "
            "inference). Send the admin token, RLCS_API_TOKEN, for that."
        )
