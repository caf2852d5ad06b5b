"""One readable sentence naming each bad field, from pydantic's error list: the same words for
a REST body (422) and an MCP tool's arguments (a tool error)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Where FastAPI says a value came from; the field's own name is what a client can act on.
_SOURCES = ("body", "query", "path", "header")


def validation_detail(errors: Sequence[Any]) -> str:
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in _SOURCES]
        where = ".".join(loc) or "body"
        if err.get("type") == "json_invalid":
            parts.append(f"body: malformed JSON ({err.get('ctx', {}).get('error', 'invalid')})")
        elif err.get("type") == "extra_forbidden":
            parts.append(f"{where}: unknown field; remove it (see /docs for the accepted fields)")
        else:
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) + "."
