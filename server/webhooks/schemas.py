"""Request and response bodies of the webhook routes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from server.schemas import Request

# The same names as core.events.EVENT_KINDS (a test checks), spelled out for the OpenAPI enum.
EventName = Literal[
    "run.started",
    "run.step",
    "run.succeeded",
    "run.failed",
    "run.stopped",
    "run.stalled",
    "sweep.finished",
]
DeliveryStatus = Literal["pending", "delivered", "failed"]


class WebhookCreateIn(Request):
    url: str = Field(
        min_length=1,
        max_length=2048,
        description="http(s) URL of the receiver: loopback, or a host listed in "
        "RLCS_WEBHOOK_ALLOWED_HOSTS",
    )
    events: Annotated[list[EventName], Field(min_length=1, max_length=7)]
    step_every: int = Field(
        1, ge=1, le=1_000_000, description="run.step fires when step % step_every == 0"
    )


class WebhookOut(BaseModel):
    webhook_id: str
    url: str
    events: list[str]
    step_every: int
    created_at: str | None


class WebhookCreatedOut(WebhookOut):
    secret: str = Field(
        description="Verifies X-RLCS-Signature; shown only in this answer (derived, never stored)"
    )


class WebhookDeletedOut(BaseModel):
    webhook_id: str
    deleted: bool


class DeliveryOut(BaseModel):
    id: str = Field(description="The delivery id, also sent as X-RLCS-Delivery")
    event: str
    order_key: str = Field(description="The run (or sweep) id; deliveries of one go in order")
    status: str = Field(description="pending, delivered or failed")
    attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: str | None
    next_attempt_at: str | None = Field(description="When a pending delivery is tried next")
    delivered_at: str | None
