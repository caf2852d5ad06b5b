"""One readable sentence naming each bad field, from pydantic's error list: the same words for
a REST body (422) and an MCP tool's arguments (a tool error)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi.exceptions import RequestValidationError

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


# FastAPI's words when it cannot even decode a body as JSON text (not UTF-8, nested past the
# parser's depth): a bare 400 in its own shape, which names neither the cause nor the fix.
FASTAPI_UNREADABLE_BODY = "There was an error parsing the body"


def unreadable_body() -> RequestValidationError:
    """The same failure as the malformed JSON it is, so every route answers it in its shape."""
    return RequestValidationError(
        [
            {
                "type": "json_invalid",
                "loc": ("body",),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": "it is not UTF-8 text, or it nests too deeply"},
            }
        ]
    )
