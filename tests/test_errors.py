"""The one table mapping domain errors to HTTP statuses, as a live app answers them: a
dependency that is down is a 503 saying when to try again, in each face's error shape."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.errors import (
    BadRequest,
    Conflict,
    DomainError,
    Forbidden,
    Gone,
    InvalidValue,
    NotFound,
    TooMany,
    Unauthorized,
    Unavailable,
)
from tests.support.settings import make_settings

CASES = [
    (BadRequest("bad"), 400),
    (Unauthorized("who"), 401),
    (Forbidden("no"), 403),
    (NotFound("none"), 404),
    (Conflict("clash"), 409),
    (Gone("this Tinker session has finished"), 410),
    (InvalidValue("field 'x': wrong"), 422),
    (TooMany("too many"), 429),
    (Unavailable("the inference worker exited while answering", retry_after_s=7), 503),
]


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    app = create_app(make_settings(tmp_path))
    raised: dict[str, DomainError] = {}

    def boom(name: str) -> None:
        raise raised[name]

    app.add_api_route("/boom/{name}", boom)
    app.add_api_route("/v1/boom/{name}", boom)
    app.state.raised = raised
    return TestClient(app)


@pytest.mark.parametrize(("error", "status"), CASES)
def test_each_error_has_its_status_and_shape(
    client: TestClient, error: DomainError, status: int
) -> None:
    client.app.state.raised["it"] = error  # type: ignore[attr-defined]
    plain = client.get("/boom/it")
    assert plain.status_code == status and plain.json() == {"detail": error.detail}
    openai = client.get("/v1/boom/it")
    # OpenAI answers a value it cannot accept with 400.
    assert openai.status_code == (400 if status == 422 else status)
    assert openai.json()["error"]["message"] == error.detail
    for resp in (plain, openai):
        if status == 503:
            assert resp.headers["Retry-After"] == "7"
            assert openai.json()["error"]["type"] == "server_error"
        else:
            assert "Retry-After" not in resp.headers
        assert ("WWW-Authenticate" in resp.headers) == (status == 401)
