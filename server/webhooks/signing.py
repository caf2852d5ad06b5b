"""Webhook signatures: each webhook's secret derived from the server's signing key (no secret
is stored), `sign` for a delivery and `verify` for a receiver (standard library only)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from pathlib import Path

from core.settings import Settings

log = logging.getLogger(__name__)
SECRET_PREFIX = "whsec_"
KEY_FILE = "webhook-signing.key"
TOLERANCE_S = 300.0  # a signature older (or newer) than this is refused: replays


def signing_key(settings: Settings) -> bytes:
    """RLCS_WEBHOOK_SIGNING_KEY, or else a random key made once in var_dir (mode 0600).

    Servers sharing one database must share the key (set the setting on each), or a webhook's
    secret would depend on which server delivers."""
    if settings.webhook_signing_key is not None:
        return settings.webhook_signing_key.get_secret_value().encode()
    path = settings.var_dir / KEY_FILE
    try:
        # O_EXCL: two servers starting at once on one var_dir keep the first one's key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_key(path)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    log.info("made a webhook signing key in %s", path)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    if path.stat().st_mode & 0o077:
        log.warning("%s is readable by others; chmod 600 it", path)
    key = path.read_text().strip()
    if not key:
        raise RuntimeError(f"{path} is empty; delete it (a new key is made) or fill it")
    return key.encode()


def secret_for(key: bytes, webhook_id: str) -> str:
    """The secret a webhook's deliveries are signed with (shown once, at creation)."""
    return SECRET_PREFIX + hmac.new(key, webhook_id.encode(), hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The X-RLCS-Signature header: `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, t.body)>`."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={_digest(secret, t, body)}"


def verify(
    secret: str,
    body: bytes,
    header: str,
    *,
    tolerance_s: float = TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """Does `header` (X-RLCS-Signature) sign `body` (the raw bytes received) with `secret`,
    at a time within `tolerance_s` of `now`? Any v1 value may match."""
    t: int | None = None
    given: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isascii() and value.isdigit():
            t = int(value)
        elif name == "v1":
            given.append(value)
    if t is None or not given:
        return False
    if abs((time.time() if now is None else now) - t) > tolerance_s:
        return False
    expected = _digest(secret, t, body)
    return any(hmac.compare_digest(expected, value) for value in given)


def _digest(secret: str, t: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
