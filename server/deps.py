"""Dependencies shared by routes: the service container and the bearer-token check (the admin
token may do anything; read tokens may list and watch)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from sqlalchemy.engine import Engine

from core.settings import Settings
from server.access import token_matches
from server.errors import Forbidden, Unauthorized
from server.services.catalog import Catalog
from server.services.chat import ChatService
from server.services.configs import ConfigService
from server.services.export import ExportService
from server.services.forks import ForkService
from server.services.inference import InferenceService
from server.services.log_follow import StreamSlots
from server.services.metrics import MetricsService
from server.services.runs import RunService
from server.services.supervisor import Supervisor
from server.services.sweeps import SweepService
from server.services.webhook_dispatch import WebhookDispatcher
from server.services.webhooks import WebhookService
from server.web_guard import SAFE_METHODS


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
    chat: ChatService


def services(request: Request) -> Services:
    return request.app.state.services


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
