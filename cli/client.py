"""HTTP to the server: base URL and token from the environment, answers or mapped errors.

Also reads the server-sent events of a followed log, through httpx-sse.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
from httpx_sse import EventSource, SSEError

from cli.exits import ApiError, CliError, Unreachable, UsageError

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 30.0


def seg(value: str) -> str:
    """One path segment: a name or id from the command line can never step to another route."""
    return quote(value, safe="")


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        if not url.startswith(("http://", "https://")):
            raise UsageError(
                "the server URL (--url or RLCS_URL) must start with http:// or https:// "
                f"(got {url!r})"
            )
        self.url = url.rstrip("/")
        self.timeout = timeout
        headers = {"Accept": "application/json", "User-Agent": "rlctl"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # Building the TLS context costs about 0.3 s per command; plain http never uses it
        # (and redirects are not followed, so no request can move to https).
        verify = self.url.startswith("https://")
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, verify=verify
        )

    @classmethod
    def from_env(cls, url: str | None = None, timeout: float | None = None) -> Client:
        # The CLI is a client, not the server: the one-Settings rule (nothing but Settings
        # reads os.environ) is about the server process, so reading our two variables here
        # keeps the CLI free of server imports.
        return cls(
            url or os.environ.get("RLCS_URL") or DEFAULT_URL,
            os.environ.get("RLCS_API_TOKEN") or None,
            timeout if timeout is not None else DEFAULT_TIMEOUT_S,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self._http.close()

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, json=body, **kwargs)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, json=body)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if kwargs.get("params"):
            kwargs["params"] = {k: v for k, v in kwargs["params"].items() if v is not None}
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            timeout = kwargs.get("timeout", self.timeout)
            raise Unreachable(
                f"no answer from {self.url} within {timeout:g} s ({method} {path}); "
                "raise --timeout if the server is busy"
            ) from None
        except httpx.TransportError as exc:
            raise Unreachable(self._unreachable(exc)) from None
        if response.status_code >= 400:
            raise _api_error(response)
        try:
            return response.json()
        except ValueError:
            raise CliError(
                f"{method} {path}: HTTP {response.status_code} with a body that is not JSON; "
                f"is {self.url} the RL control server?"
            ) from None

    def events(self, path: str, params: dict[str, Any]) -> Iterator[tuple[str, str]]:
        """(event, data) pairs of a server-sent event stream, until the server closes it."""
        # No read timeout: a quiet run may print nothing for minutes, and that is not a fault.
        timeout = httpx.Timeout(self.timeout, read=None)
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        try:
            with self._http.stream(
                "GET", path, params=params, headers=headers, timeout=timeout
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _api_error(response)
                for event in EventSource(response).iter_sse():
                    yield event.event, event.data
        except SSEError as exc:
            raise CliError(f"GET {path}: {exc}; is {self.url} the RL control server?") from None
        except httpx.TimeoutException:
            raise Unreachable(f"no answer from {self.url} within {self.timeout:g} s") from None
        except httpx.TransportError as exc:
            raise Unreachable(self._unreachable(exc)) from None

    def _unreachable(self, exc: httpx.TransportError) -> str:
        why = str(exc) or type(exc).__name__
        return (
            f"cannot reach the server at {self.url} ({why}); is it running? "
            "Set RLCS_URL to its address."
        )


def _api_error(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
        detail = body["detail"] if isinstance(body, dict) and "detail" in body else body
    except ValueError:
        detail = response.text.strip()[:500] or "(empty body)"
    if not isinstance(detail, str):
        detail = json.dumps(detail)
    if response.status_code == 401 and not response.request.headers.get("Authorization"):
        detail += " (set RLCS_API_TOKEN)"
    return ApiError(response.status_code, response.reason_phrase, detail)
