"""The webhooks domain's service, as its routes depend on it (read from the app's container,
which they need not import)."""

from __future__ import annotations

from fastapi import Request

from server.webhooks.service import WebhookService


def webhook_service(request: Request) -> WebhookService:
    service: WebhookService = request.app.state.services.webhooks
    return service
