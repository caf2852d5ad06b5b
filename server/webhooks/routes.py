"""Webhooks: register a receiver of run and sweep events, list and remove them, and read
each one's deliveries."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from core.models import WEBHOOK_ID
from server.deps import Services, services
from server.webhooks.schemas import (
    DeliveryOut,
    DeliveryStatus,
    WebhookCreatedOut,
    WebhookCreateIn,
    WebhookDeletedOut,
    WebhookOut,
)

router = APIRouter(tags=["webhooks"])
Svc = Annotated[Services, Depends(services)]
WebhookId = Annotated[
    str, Path(pattern=WEBHOOK_ID.pattern, description="A webhook id such as wh-3f9c2a1b")
]


@router.post("/webhooks", response_model=WebhookCreatedOut)
def create_webhook(body: WebhookCreateIn, svc: Svc) -> dict[str, Any]:
    """Deliveries are JSON POSTs signed in X-RLCS-Signature with the `secret` answered here
    (and only here)."""
    return svc.webhooks.create(body.url, list(body.events), body.step_every)


@router.get("/webhooks", response_model=list[WebhookOut])
def list_webhooks(svc: Svc) -> list[dict[str, Any]]:
    return svc.webhooks.list()


@router.get("/webhooks/{webhook_id}", response_model=WebhookOut)
def get_webhook(webhook_id: WebhookId, svc: Svc) -> dict[str, Any]:
    return svc.webhooks.get(webhook_id)


@router.delete("/webhooks/{webhook_id}", response_model=WebhookDeletedOut)
def delete_webhook(webhook_id: WebhookId, svc: Svc) -> dict[str, Any]:
    return svc.webhooks.delete(webhook_id)


@router.get("/webhooks/{webhook_id}/deliveries", response_model=list[DeliveryOut])
def list_deliveries(
    webhook_id: WebhookId,
    svc: Svc,
    status: DeliveryStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """Newest first."""
    return svc.webhooks.deliveries(webhook_id, status, limit)
