"""Dependencies shared by routes: the service container and the bearer-token check."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from sqlalchemy.engine import Engine

from core.settings import Settings
from server.access import token_matches
from server.errors import Unauthorized
from server.services.catalog import Catalog
from server.services.configs import ConfigService
from server.services.inference import InferenceService
from server.services.metrics import MetricsService
from server.services.runs import RunService
from server.services.supervisor import Supervisor


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


def services(request: Request) -> Services:
    return request.app.state.services


def require_token(request: Request) -> None:
    token = request.app.state.settings.api_token
    if token is None:
        return
    if not token_matches(request.headers.get("authorization", ""), token.get_secret_value()):
        raise Unauthorized(
            "Missing or wrong token: send the header 'Authorization: Bearer <RLCS_API_TOKEN>'."
        )
