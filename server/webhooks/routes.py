"""Webhooks: register a receiver of run and sweep events, list and remove them, and read
each one's deliveries."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from core.models import WEBHOOK_ID
from server.webhooks.deps import webhook_service
from server.webhooks.schemas import (
    DeliveryOut,
    DeliveryStatus,
    WebhookCreatedOut,
    WebhookCreateIn,
    WebhookDeletedOut,
    WebhookOut,
)
from server.webhooks.service import WebhookService

router = APIRouter(tags=["webhooks"])
Webhooks = Annotated[WebhookService, Depends(webhook_service)]
WebhookId = Annotated[
    str, Path(pattern=WEBHOOK_ID.pattern, description="A webhook id such as wh-3f9c2a1b")
]


@router.post("/webhooks")
def create_webhook(body: WebhookCreateIn, webhooks: Webhooks) -> WebhookCreatedOut:
    """Deliveries are JSON POSTs signed in X-RLCS-Signature with the `secret` answered here
    (and only here)."""
    return webhooks.create(body.url, list(body.events), body.step_every)


@router.get("/webhooks")
def list_webhooks(webhooks: Webhooks) -> list[WebhookOut]:
    return webhooks.list()


@router.get("/webhooks/{webhook_id}")
def get_webhook(webhook_id: WebhookId, webhooks: Webhooks) -> WebhookOut:
    return webhooks.get(webhook_id)


@router.delete("/webhooks/{webhook_id}")
def delete_webhook(webhook_id: WebhookId, webhooks: Webhooks) -> WebhookDeletedOut:
    return webhooks.delete(webhook_id)


@router.get("/webhooks/{webhook_id}/deliveries")
def list_deliveries(
    webhook_id: WebhookId,
    webhooks: Webhooks,
    status: DeliveryStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[DeliveryOut]:
    """Newest first."""
    return webhooks.deliveries(webhook_id, status, limit)
