"""The sweeps domain's service, as its routes depend on it (read from the app's container,
which they need not import)."""

from __future__ import annotations

from fastapi import Request

from server.sweeps.service import SweepService


def sweep_service(request: Request) -> SweepService:
    service: SweepService = request.app.state.services.sweeps
    return service
