"""Who may use the Tinker API: the SDK sends its key as X-API-Key, and it must start with
`tml-` (the SDK itself insists). Without RLCS_API_TOKEN the server answers this machine only
(server.guards.access), so any `tml-` key is taken; with a token, the key is `tml-<token>`."""

from __future__ import annotations

import secrets

from core.settings import Settings
from server.errors import Unauthorized

KEY_PREFIX = "tml-"


def check_key(settings: Settings, key: str | None) -> None:
    if not key or not key.startswith(KEY_PREFIX):
        raise Unauthorized(
            "X-API-Key: missing or not a Tinker key. Set TINKER_API_KEY=tml-<anything> for "
            "this server (with RLCS_API_TOKEN set where it runs: tml-<that token>)."
        )
    token = settings.api_token
    if token is None:
        return
    expected = f"{KEY_PREFIX}{token.get_secret_value()}"
    if not secrets.compare_digest(key.encode(), expected.encode()):
        raise Unauthorized(
            "X-API-Key: wrong key. This server takes a token: set TINKER_API_KEY=tml-<the "
            "server's RLCS_API_TOKEN>."
        )
