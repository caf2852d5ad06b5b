"""The service container the app builds in its lifespan, for the app and its faces (/mcp, /v1,
/health) only: a domain's routes ask for their own service (its `deps` module)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from sqlalchemy.engine import Engine

from core.settings import Settings
from server.engine.hosts import EngineHosts
from server.engine.service import EngineService
from server.environments.catalog import Catalog
from server.environments.configs import ConfigService
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
