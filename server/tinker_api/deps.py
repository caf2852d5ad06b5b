"""The Tinker API's services, as its routes depend on them (read from the app's container,
which they need not import)."""

from __future__ import annotations

from fastapi import Request

from server.tinker_api.rest import TinkerRest
from server.tinker_api.service import TinkerService


def tinker_service(request: Request) -> TinkerService:
    service: TinkerService = request.app.state.services.tinker
    return service


def tinker_rest(request: Request) -> TinkerRest:
    service: TinkerRest = request.app.state.services.tinker_rest
    return service
