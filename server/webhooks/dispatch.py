"""Delivering webhooks: an asyncio task that, while this server supervises the runs (one
server per database), fans new events out and sends due deliveries, signed, in order per run
(or sweep), retrying with doubling backoff. All state is in the database: a restarted server
goes on where the last one stopped (at least once, each delivery keeping its id)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from sqlalchemy import and_, func
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from core.db import read_session, write_session
from core.models import Webhook, WebhookDelivery, utcnow
from core.settings import Settings
from server.launch.leadership import Leadership
from server.webhooks.fanout import FanOut
from server.webhooks.service import host_allowed
from server.webhooks.signing import sign

log = logging.getLogger(__name__)
RETRY_CAP_S = 300.0
SEND_BATCH = 64  # deliveries sent at once, at most
ROUNDS = 20  # rounds of sending in one tick, at most
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


@dataclass
class _Due:
    id: str
    webhook_id: str
    url: str
    kind: str
    body: str
    attempts: int


@dataclass
class _Outcome:
    id: str
    status_code: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class WebhookDispatcher:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        leadership: Leadership,
        fanout: FanOut,
        secret: Callable[[str], str],
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._leadership = leadership
        self._fanout = fanout
        self._secret = secret
        self._clock = clock
        self._http: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="rlcs-webhooks")

    async def stop(self) -> None:
        """Stop; a delivery cut off mid-send stays pending and goes again after a restart."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _run(self) -> None:
        while True:
            try:
                # Only the supervising server delivers, so two servers never both send.
                if self._leadership.held:
                    await self.tick()
            except Exception:  # a bad tick must not end delivery
                log.exception("webhook tick failed")
            await asyncio.sleep(self._settings.webhook_interval_s)

    async def tick(self) -> int:
        """One pass: notice stalls and finished sweeps, fan out, send what is due; how many
        deliveries were tried."""
        await asyncio.to_thread(self._fanout.notice_stalls)
        await asyncio.to_thread(self._fanout.notice_finished_sweeps)
        await asyncio.to_thread(self._fanout.fan_out)
        tried = 0
        # Each round sends the head of every queue; a delivered head lets the next one go in
        # the next round, so a run's backlog drains within one tick (failures wait to retry).
        for _ in range(ROUNDS):
            due = await asyncio.to_thread(self._due)
            if not due:
                break
            outcomes = await asyncio.gather(*(self._send(d) for d in due))
            await asyncio.to_thread(self._record, outcomes)
            tried += len(outcomes)
        return tried

    def _due(self) -> list[_Due]:
        """For each webhook and run (or sweep), its oldest pending delivery, if its time has
        come: a later one waits behind it, so each receiver hears of a run in order."""
        d = WebhookDelivery
        heads = (
            select(d.webhook_id, d.order_key, func.min(d.event_id).label("first"))
            .where(d.status == PENDING)
            .group_by(col(d.webhook_id), col(d.order_key))
            .subquery()
        )
        query = (
            select(d, Webhook.url)
            .join(
                heads,
                and_(
                    col(d.webhook_id) == heads.c.webhook_id,
                    col(d.order_key) == heads.c.order_key,
                    col(d.event_id) == heads.c.first,
                ),
            )
            .join(Webhook, col(Webhook.id) == col(d.webhook_id))
            .where(col(d.next_attempt_at) <= self._clock())
            .order_by(col(d.next_attempt_at))
            .limit(SEND_BATCH)
        )
        with read_session(self._engine) as session:
            rows = session.exec(query).all()
        return [_Due(r.id, r.webhook_id, url, r.kind, r.body, r.attempts) for r, url in rows]

    async def _send(self, due: _Due) -> _Outcome:
        host = httpx.URL(due.url).host
        if not host_allowed(host, self._settings.webhook_allowed_hosts):
            # Allowed when it was made; the operator has since taken the host off the list.
            return _Outcome(due.id, None, f"host {host} is not in RLCS_WEBHOOK_ALLOWED_HOSTS now")
        body = due.body.encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "rlcs-webhooks",
            "X-RLCS-Delivery": due.id,
            "X-RLCS-Event": due.kind,
            "X-RLCS-Signature": sign(
                self._secret(due.webhook_id), body, int(self._clock().timestamp())
            ),
        }
        if self._http is None:
            # No proxies from the environment: a delivery goes to the host that was checked.
            self._http = httpx.AsyncClient(
                timeout=self._settings.webhook_timeout_s, follow_redirects=False, trust_env=False
            )
        try:
            # Streamed and not read: only the status matters, however much a receiver says.
            async with self._http.stream("POST", due.url, content=body, headers=headers) as resp:
                return _Outcome(due.id, resp.status_code, None)
        except Exception as exc:  # any failure to deliver is a failed attempt, retried
            return _Outcome(due.id, None, f"{type(exc).__name__}: {exc}"[:500])

    def _record(self, outcomes: list[_Outcome]) -> None:
        now = self._clock()
        limit = self._settings.webhook_max_attempts
        with write_session(self._engine) as session:
            for outcome in outcomes:
                row = session.get(WebhookDelivery, outcome.id)
                if row is None or row.status != PENDING:  # removed with its webhook meanwhile
                    continue
                row.attempts += 1
                row.last_status_code = outcome.status_code
                if outcome.ok:
                    row.status, row.delivered_at, row.last_error = DELIVERED, now, None
                else:
                    row.last_error = outcome.error or f"HTTP {outcome.status_code}"
                    if row.attempts >= limit:
                        row.status = FAILED
                        log.warning("webhook delivery %s failed: %s", row.id, row.last_error)
                    else:
                        row.next_attempt_at = now + timedelta(seconds=self.backoff(row.attempts))
                session.add(row)

    def backoff(self, attempts: int) -> float:
        """Seconds before the next try after `attempts` failed ones: base, 2 base, 4 base..."""
        return min(RETRY_CAP_S, self._settings.webhook_retry_base_s * 2.0 ** (attempts - 1))
