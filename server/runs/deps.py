"""The runs domain's services, as its routes depend on them (read from the app's container,
which they need not import)."""

from __future__ import annotations

from fastapi import Request

from server.runs.export import ExportService
from server.runs.forks import ForkService
from server.runs.logs import StreamSlots
from server.runs.rollouts import RolloutService
from server.runs.service import RunService


def run_service(request: Request) -> RunService:
    service: RunService = request.app.state.services.runs
    return service


def fork_service(request: Request) -> ForkService:
    service: ForkService = request.app.state.services.forks
    return service


def stream_slots(request: Request) -> StreamSlots:
    service: StreamSlots = request.app.state.services.streams
    return service


def export_service(request: Request) -> ExportService:
    service: ExportService = request.app.state.services.export
    return service


def rollout_service(request: Request) -> RolloutService:
    service: RolloutService = request.app.state.services.rollouts
    return service
