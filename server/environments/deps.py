"""The environments domain's services, as its routes depend on them (read from the app's
container, which they need not import)."""

from __future__ import annotations

from fastapi import Request

from server.environments.catalog import Catalog
from server.environments.configs import ConfigService


def catalog(request: Request) -> Catalog:
    service: Catalog = request.app.state.services.catalog
    return service


def config_service(request: Request) -> ConfigService:
    service: ConfigService = request.app.state.services.configs
    return service
