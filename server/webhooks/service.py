"""Webhooks: register a receiver (checked URL, chosen events), list and remove them, and read
their deliveries. Delivery itself is server.webhooks.dispatch."""

from __future__ import annotations

import builtins
import ipaddress
import json
import re
import secrets

import httpx
from sqlalchemy import delete
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from core.db import read_session, write_session
from core.events import EVENT_KINDS
from core.models import Webhook, WebhookDelivery, iso
from core.net import is_loopback, parse_ip
from core.settings import Settings
from server.errors import InvalidValue, NotFound
from server.webhooks.schemas import DeliveryOut, WebhookCreatedOut, WebhookDeletedOut, WebhookOut
from server.webhooks.signing import secret_for

DELIVERY_STATUSES = ("pending", "delivered", "failed")
_HOST = re.compile(r"[\w.:-]+")  # a name (IDN letters too) or an IP address; no %, no spaces


class WebhookService:
    def __init__(self, settings: Settings, engine: Engine, signing_key: bytes) -> None:
        self._settings = settings
        self._engine = engine
        self._key = signing_key

    def create(self, url: str, events: list[str], step_every: int = 1) -> WebhookCreatedOut:
        """Check everything, then write the webhook; the answer holds its secret (only here)."""
        url = check_url(url, self._settings.webhook_allowed_hosts)
        kinds = check_events(events)
        if step_every < 1:
            raise InvalidValue("step_every: must be 1 or more (run.step fires every N steps).")
        hook = Webhook(
            id=f"wh-{secrets.token_hex(4)}",
            url=url,
            events_json=json.dumps(kinds),
            step_every=step_every,
        )
        view = _view(hook)
        with write_session(self._engine) as session:
            session.add(hook)
        return WebhookCreatedOut(**view.model_dump(), secret=self.secret(view.webhook_id))

    def secret(self, webhook_id: str) -> str:
        return secret_for(self._key, webhook_id)

    def list(self) -> list[WebhookOut]:
        with read_session(self._engine) as session:
            hooks = session.exec(select(Webhook).order_by(col(Webhook.created_at))).all()
        return [_view(h) for h in hooks]

    def get(self, webhook_id: str) -> WebhookOut:
        return _view(self._row(webhook_id))

    def delete(self, webhook_id: str) -> WebhookDeletedOut:
        """Remove the webhook and its deliveries (pending ones are not sent)."""
        with write_session(self._engine) as session:
            hook = session.get(Webhook, webhook_id)
            if hook is None:
                raise _not_found(webhook_id)
            session.exec(delete(WebhookDelivery).where(col(WebhookDelivery.webhook_id) == hook.id))
            session.delete(hook)
        return WebhookDeletedOut(webhook_id=webhook_id, deleted=True)

    def deliveries(
        self, webhook_id: str, status: str | None = None, limit: int = 100
    ) -> builtins.list[DeliveryOut]:
        """Newest first."""
        self._row(webhook_id)
        query = select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
        if status is not None:
            if status not in DELIVERY_STATUSES:
                raise InvalidValue(f"status: choose one of {', '.join(DELIVERY_STATUSES)}.")
            query = query.where(WebhookDelivery.status == status)
        query = query.order_by(col(WebhookDelivery.event_id).desc()).limit(limit)
        with read_session(self._engine) as session:
            rows = session.exec(query).all()
        return [delivery_view(d) for d in rows]

    def _row(self, webhook_id: str) -> Webhook:
        with read_session(self._engine) as session:
            hook = session.get(Webhook, webhook_id)
        if hook is None:
            raise _not_found(webhook_id)
        return hook


def check_url(url: str, allowed_hosts: list[str]) -> str:
    """The URL, if webhooks may call it: http(s), a loopback host or one the operator listed."""
    url = url.strip()
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        raise InvalidValue(
            f"url: '{url[:200]}' is not a URL; give http(s)://host[:port]/path."
        ) from None
    if parsed.scheme not in ("http", "https"):
        raise InvalidValue(
            f"url: only http:// and https:// URLs are accepted (got '{parsed.scheme or url[:40]}')."
        )
    host = parsed.host
    if not parsed.is_absolute_url or not host or not _HOST.fullmatch(host):
        raise InvalidValue(f"url: '{url[:200]}' has no valid host; give http(s)://host[:port]/.")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise InvalidValue(f"url: port {parsed.port} is out of range (1-65535).")
    if parsed.userinfo:
        raise InvalidValue(
            "url: user:password@ in a webhook URL would be stored in the database; drop it and "
            "check the X-RLCS-Signature header in the receiver instead."
        )
    if not host_allowed(host, allowed_hosts):
        raise InvalidValue(
            f"url: the host '{host}' is not loopback and not listed in RLCS_WEBHOOK_ALLOWED_HOSTS; "
            "add it there (comma-separated names, IP addresses or CIDR networks) where the "
            "server runs, or use a receiver on this machine (localhost, 127.0.0.1, ::1)."
        )
    return url


def host_allowed(host: str, allowed_hosts: list[str]) -> bool:
    """Loopback always; otherwise an exact name, an equal address or a listed network."""
    if is_loopback(host):
        return True
    host = host.lower().rstrip(".")
    address = parse_ip(host)
    for entry in allowed_hosts:
        entry = entry.lower().strip().strip("[]").rstrip(".")
        if address is not None and "/" in entry:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
        elif address is not None and parse_ip(entry) is not None:
            if parse_ip(entry) == address:
                return True
        elif entry == host:
            return True
    return False


def check_events(events: list[str]) -> list[str]:
    """Known event names, in their canonical order, each once."""
    if not events:
        raise InvalidValue(f"events: give at least one of {', '.join(EVENT_KINDS)}.")
    unknown = [e for e in events if e not in EVENT_KINDS]
    if unknown:
        raise InvalidValue(
            f"events: unknown event '{str(unknown[0])[:60]}'; choose among "
            f"{', '.join(EVENT_KINDS)}."
        )
    return [k for k in EVENT_KINDS if k in events]


def events_of(hook: Webhook) -> list[str]:
    return list(json.loads(hook.events_json))


def _view(hook: Webhook) -> WebhookOut:
    return WebhookOut(
        webhook_id=hook.id,
        url=hook.url,
        events=events_of(hook),
        step_every=hook.step_every,
        created_at=iso(hook.created_at),
    )


def delivery_view(d: WebhookDelivery) -> DeliveryOut:
    return DeliveryOut(
        id=d.id,
        event=d.kind,
        order_key=d.order_key,
        status=d.status,
        attempts=d.attempts,
        last_status_code=d.last_status_code,
        last_error=d.last_error,
        created_at=iso(d.created_at),
        next_attempt_at=iso(d.next_attempt_at) if d.status == "pending" else None,
        delivered_at=iso(d.delivered_at),
    )


def _not_found(webhook_id: str) -> NotFound:
    return NotFound(f"No webhook '{webhook_id}'. GET /webhooks lists the webhooks.")
