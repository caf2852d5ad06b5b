"""Errors on /v1 in OpenAI's shape, `{"error": {message, type, param, code}}`, which OpenAI
clients read; every other path keeps the server's `{"detail": ...}`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from server.errors import DomainError, headers_for, status_for
from server.openai_compat.schemas import OpenAIErrorBody, OpenAIErrorOut

PREFIXES = ("/v1/", "/inference/v1/")  # OpenAI's routes and vLLM's generate beside them
# Answered by our handlers (OpenAI's shape); the middleware's 403/413/415 come before them and
# keep {"detail"}, as documented for every route. A 503 (with Retry-After) is ours when the
# inference worker or a backend is down, {"detail"} when the database is busy.
OPENAI_CODES = ("400", "401", "404")
Handler = Callable[[Request, Any], Response | Awaitable[Response]]  # as the app holds them


def error_body(message: str, status: int, param: str | None, code: str | None) -> OpenAIErrorOut:
    kind = {
        401: "authentication_error",
        403: "permission_error",
        429: "rate_limit_error",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return OpenAIErrorOut(error=OpenAIErrorBody(message=message, type=kind, param=param, code=code))


def domain_error(exc: DomainError) -> JSONResponse:
    # OpenAI answers a value it cannot accept with 400, not 422.
    status = 400 if status_for(exc) == 422 else status_for(exc)
    code = exc.extra.get("code") or ("invalid_api_key" if status == 401 else None)
    headers = headers_for(exc)
    body = error_body(exc.detail, status, exc.extra.get("param"), code)
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def validation_error(exc: RequestValidationError) -> JSONResponse:
    """400 naming each bad field; `param` is the first of them, as OpenAI names one."""
    parts, params = [], []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        # A union's members appear in the location ("str", "list[...]"): drop them.
        where = ".".join(p for p in loc if not p.startswith(("str", "list[", "function-"))) or ""
        params.append(where or None)
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', '')})")
        elif err.get("type") == "extra_forbidden":
            parts.append(f"{where}: not supported by this server; leave it out")
        else:
            parts.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
    message = "; ".join(dict.fromkeys(parts)) + "."
    body = error_body(message, 400, params[0] if params else None, None)
    return JSONResponse(body.model_dump(mode="json"), 400)


def install(app: FastAPI) -> None:
    """Answer errors on /v1 (and /inference/v1) paths in OpenAI's shape; call after the app's
    own handlers."""

    def scoped(original: Handler, convert: Callable[[Any], JSONResponse]) -> Handler:
        async def handle(request: Request, exc: Any) -> Response:
            if request.url.path.startswith(PREFIXES):
                return convert(exc)
            answer = original(request, exc)
            return answer if isinstance(answer, Response) else await answer

        return handle

    handlers = app.exception_handlers
    handlers[DomainError] = scoped(handlers[DomainError], domain_error)
    handlers[RequestValidationError] = scoped(handlers[RequestValidationError], validation_error)
    _document(app)


def _document(app: FastAPI) -> None:
    """Declare the OpenAI error body for /v1 operations in the OpenAPI document."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        defs = OpenAIErrorOut.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(defs.pop("$defs", {}))
        schemas["OpenAIError"] = defs
        ref = {"$ref": "#/components/schemas/OpenAIError"}
        either = {"anyOf": [ref, {"$ref": "#/components/schemas/Error"}]}
        for path, item in schema.get("paths", {}).items():
            if not path.startswith(PREFIXES):
                continue
            for operation in item.values():
                responses = operation.setdefault("responses", {})
                for code in OPENAI_CODES:
                    responses[code] = {
                        "description": "Error in OpenAI's shape",
                        "content": {"application/json": {"schema": ref}},
                    }
                # A read-only token's refusal (ours) or a remote peer's (the middleware's).
                responses["403"] = {
                    "description": "Refused",
                    "content": {"application/json": {"schema": either}},
                }
                responses["503"] = {
                    "description": "A dependency is down or the database busy; see Retry-After",
                    "content": {"application/json": {"schema": either}},
                }
                responses.pop("409", None)
                responses.pop("422", None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
