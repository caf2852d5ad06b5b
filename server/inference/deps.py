"""The inference domain's service, as its route depends on it (read from the app's container,
which it need not import)."""

from __future__ import annotations

from fastapi import Request

from server.inference.service import InferenceService


def inference_service(request: Request) -> InferenceService:
    service: InferenceService = request.app.state.services.inference
    return service
