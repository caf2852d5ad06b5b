"""The webhooks domain's service, as its routes depend on it (read from the app's container,
which they need not import)."""

from __future__ import annotations

from server.service_of import service_of
from server.webhooks.service import WebhookService

webhook_service = service_of("webhooks", WebhookService)
