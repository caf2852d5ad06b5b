"""Signed download URLs, as the hosted service hands them out: `tinker checkpoint download`
and `tinker session export-trace` fetch files with a plain GET and no key. A URL names one
file, carries its expiry and an HMAC of both under a key made when the server starts, so it
works on this server for an hour and for nothing else."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from urllib.parse import quote

from server.errors import Forbidden

PREFIX = "/api/v1/downloads/"
LIFETIME_S = 3600.0  # as the hosted service's signed URLs


class DownloadSigner:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._key = secrets.token_bytes(32)
        self._clock = clock

    def url(self, base_url: str, path: str) -> tuple[str, float]:
        """A signed URL for `path` (below /api/v1/downloads/), and when it expires (epoch s)."""
        expires = int(self._clock() + LIFETIME_S)
        signature = self._sign(path, expires)
        query = f"expires={expires}&signature={signature}"
        return f"{base_url.rstrip('/')}{PREFIX}{quote(path)}?{query}", float(expires)

    def check(self, path: str, expires: int, signature: str) -> None:
        """Forbidden unless the signature is this server's for `path` and has not expired."""
        # As bytes: compare_digest refuses str with characters outside ASCII (a TypeError).
        given = signature.encode("utf-8", "replace")
        if not hmac.compare_digest(self._sign(path, expires).encode(), given):
            raise Forbidden(
                "signature: this download URL was not signed by this server (or was changed); "
                "ask for a new one (external_weights_urls, or the session's trace_export)"
            )
        if self._clock() > expires:
            raise Forbidden(
                "expires: this download URL expired; ask for a new one (they last an hour)"
            )

    def _sign(self, path: str, expires: int) -> str:
        message = f"{path}\n{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
