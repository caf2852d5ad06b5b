"""Dependencies shared by routes: the service container and the bearer-token check."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from fastapi import Request
from sqlalchemy.engine import Engine

from server.errors import Unauthorized
from server.services.catalog import Catalog
from server.services.configs import ConfigService
from server.services.inference import InferenceService
from server.services.metrics import MetricsService
from server.services.runs import RunService
from server.services.supervisor import Supervisor
from server.settings import Settings


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
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(
        given.strip().encode(), token.get_secret_value().encode()
    ):
        raise Unauthorized(
            "Missing or wrong token: send the header 'Authorization: Bearer <RLCS_API_TOKEN>'."
        )
