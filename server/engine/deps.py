"""The engine domain's service, as its route depends on it (read from the app's container,
which it need not import)."""

from __future__ import annotations

from fastapi import Request

from server.engine.service import EngineService


def engine_service(request: Request) -> EngineService:
    service: EngineService = request.app.state.services.engine_status
    return service
