"""No way in from a web page: Host allowlist, cross-site writes refused, JSON-only bodies,
body size cap, read-only tokens. Every refusal changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from server.app import create_app
from server.guards.web import host_name
from server.openai_compat.errors import PREFIXES as OPENAI_PREFIXES
from tests.support.settings import make_settings

LOCAL = "http://127.0.0.1:8080"
EVIL = {"Origin": "http://evil.example", "Content-Type": "text/plain"}


def loopback_settings(tmp_path: Path, **overrides: object) -> Settings:
    """The `make serve` defaults: no token, no explicit host list."""
    return make_settings(tmp_path, allowed_hosts=[], **overrides)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(loopback_settings(tmp_path)), base_url=LOCAL) as client:
        yield client


def write_routes() -> list[tuple[str, str]]:
    """Every state-changing route of the app, with placeholders filled in."""
    paths = create_app(make_settings(Path("/nonexistent"))).openapi()["paths"]
    found = []
    for template, operations in paths.items():
        path = template.replace("{name}", "arithmetic").replace("{run_id}", "r-00000000")
        found.extend((m.upper(), path) for m in operations if m.upper() not in ("GET", "HEAD"))
    return sorted(found)


WRITES = write_routes()


def state(client: TestClient) -> tuple[object, ...]:
    config = client.get("/config")
    return (config.status_code, config.text, client.get("/runs").text)


def test_every_write_route_is_covered() -> None:
    paths = {path for _, path in WRITES}
    assert {"/environments/arithmetic/select", "/runs", "/config", "/test/inference"} <= paths
    assert "/runs/r-00000000/stop" in paths and "/runs/r-00000000/resume" in paths


@pytest.mark.parametrize(("method", "path"), WRITES)
def test_cross_site_writes_are_refused_and_change_nothing(
    local: TestClient, method: str, path: str
) -> None:
    before = state(local)
    for headers, body in (
        (EVIL, "{}"),  # a "simple" cross-site request: no preflight in a browser
        ({"Origin": "http://evil.example"}, None),  # body-less: select, stop, resume
        ({"Sec-Fetch-Site": "cross-site"}, None),  # a browser that hides the Origin
        ({"Origin": "http://localhost:3000"}, None),  # another port on this machine
        ({"Origin": "null"}, None),  # a sandboxed frame
    ):
        resp = local.request(method, path, headers=headers, content=body)
        assert resp.status_code == 403, (headers, resp.text)
        assert "RLCS_CORS_ORIGINS" in resp.json()["detail"]
    assert state(local) == before


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("evil.example:8080", 400),
        ("evil.example", 400),
        ("127.0.0.1.nip.io", 400),
        ("localhost:8080", 200),
        ("LOCALHOST.:8080", 200),
        ("127.0.0.1", 200),
        ("[::1]:8080", 200),
    ],
)
def test_host_allowlist_by_default(local: TestClient, host: str, status: int) -> None:
    assert local.get("/runs", headers={"Host": host}).status_code == status


def test_host_allowlist_settings(tmp_path: Path) -> None:
    evil = {"Host": "evil.example:8080"}
    named = make_settings(tmp_path / "a", allowed_hosts=["rl.internal"])
    with TestClient(create_app(named), base_url="http://rl.internal:8080") as client:
        assert client.get("/runs").status_code == 200
        assert client.get("/runs", headers=evil).status_code == 400
    anything = make_settings(tmp_path / "b", allowed_hosts=["*"])
    with TestClient(create_app(anything)) as client:
        assert client.get("/runs", headers=evil).status_code == 200
    # With a token there is no default list: a page without the token gets 401 anyway.
    token = loopback_settings(tmp_path / "c", api_token="admin-secret-1")
    with TestClient(create_app(token)) as client:
        assert client.get("/runs", headers=evil).status_code == 401
    # Comma-separated from the environment, as an operator writes it.
    parsed = Settings(_env_file=None, allowed_hosts="rl.internal, gpu-box ,")  # type: ignore[call-arg]
    assert parsed.host_allowlist() == frozenset({"rl.internal", "gpu-box"})


def test_host_name() -> None:
    assert host_name("Example.COM:80") == "example.com"
    assert host_name("[::1]:8080") == "::1"
    assert host_name("::1") == "::1"
    assert host_name("box.") == "box"


def test_same_origin_pages_and_scripts_may_write(local: TestClient) -> None:
    dashboard = {"Origin": LOCAL, "Sec-Fetch-Site": "same-origin"}
    assert local.post("/environments/arithmetic/select", headers=dashboard).status_code == 200
    typed = local.post("/config", json={"field": "group_size", "value": 8}, headers=dashboard)
    assert typed.status_code == 200
    assert local.post("/environments/repeat_word/select").status_code == 200  # curl, SDKs


def test_bodies_must_be_json(local: TestClient) -> None:
    local.post("/environments/arithmetic/select")
    before = state(local)
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        body = '{"field": "group_size", "value": 8}'
        resp = local.post("/config", content=body, headers=headers)
        assert resp.status_code == 415, content_type
        assert "application/json" in resp.json()["detail"]
    assert state(local) == before
    charset = {"Content-Type": "application/json; charset=utf-8"}
    ok = local.post("/config", content='{"field": "group_size", "value": 8}', headers=charset)
    assert ok.status_code == 200


def test_a_body_json_cannot_read_is_malformed_json_naming_the_cause(local: TestClient) -> None:
    """Not UTF-8, or nested past the parser's depth: FastAPI alone answers a bare 400 that
    says neither what nor how to fix it."""
    local.post("/environments/arithmetic/select")
    before = state(local)
    for body in (b"\x80{}", b"[" * 100_000):
        resp = local.post("/config", content=body, headers={"Content-Type": "application/json"})
        assert resp.status_code == 422, resp.text
        detail = resp.json()["detail"]
        assert "malformed JSON" in detail and "UTF-8" in detail, detail
    assert state(local) == before


def test_cors_is_opt_in(tmp_path: Path) -> None:
    app_origin = "https://app.example"
    settings = loopback_settings(tmp_path, cors_origins=[app_origin])
    with TestClient(create_app(settings), base_url=LOCAL) as client:
        preflight = client.options(
            "/environments/arithmetic/select",
            headers={"Origin": app_origin, "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == app_origin
        allowed = client.post("/environments/arithmetic/select", headers={"Origin": app_origin})
        assert allowed.status_code == 200
        other = client.post("/environments/arithmetic/select", headers=EVIL)
        assert other.status_code == 403
    with TestClient(create_app(loopback_settings(tmp_path / "off")), base_url=LOCAL) as client:
        preflight = client.options(
            "/runs", headers={"Origin": app_origin, "Access-Control-Request-Method": "POST"}
        )
        assert "access-control-allow-origin" not in preflight.headers


def test_oversize_bodies_get_413_declared_or_streamed(tmp_path: Path) -> None:
    settings = loopback_settings(tmp_path, max_body_bytes=4096)
    with TestClient(create_app(settings), base_url=LOCAL) as client:
        client.post("/environments/arithmetic/select")
        before = state(client)
        big = '{"field": "system_prompt", "value": "' + "x" * 5000 + '"}'
        declared = client.post("/config", content=big, headers={"Content-Type": "application/json"})
        assert declared.status_code == 413
        assert "RLCS_MAX_BODY_BYTES" in declared.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
            data = big.encode()
            for i in range(0, len(data), 1000):
                yield data[i : i + 1000]

        streamed = client.post(
            "/config", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert streamed.status_code == 413
        assert "RLCS_MAX_BODY_BYTES" in streamed.json()["detail"]
        assert state(client) == before
        small = client.post("/config", json={"field": "system_prompt", "value": "x" * 100})
        assert small.status_code == 200


ADMIN, READER, OTHER_READER = "admin-secret-1", "reader-secret-2", "reader-secret-3"


def test_read_tokens_may_watch_but_not_change(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, api_token=ADMIN, read_tokens=f"{READER},{OTHER_READER}", allowed_hosts=[]
    )
    with TestClient(create_app(settings), base_url=LOCAL) as client:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        reader = {"Authorization": f"Bearer {READER}"}
        assert client.post("/environments/arithmetic/select", headers=admin).status_code == 200
        before = client.get("/config", headers=admin).text, client.get("/runs", headers=admin).text
        for token in (READER, OTHER_READER):
            headers = {"Authorization": f"Bearer {token}"}
            for path in ("/runs", "/config", "/environments"):
                assert client.get(path, headers=headers).status_code == 200, path
        for method, path in WRITES:
            if path.startswith("/api/v1/"):
                continue  # the Tinker SDK's API takes its own key (tests/tinker_api), no token
            resp = client.request(method, path, headers=reader, json={})
            assert resp.status_code == 403, (method, path, resp.text)
            body = resp.json()
            # /v1 (and vLLM's generate beside it) answers in OpenAI's error shape, every other
            # route with {"detail": ...}.
            openai_shape = path.startswith(OPENAI_PREFIXES)
            message = body["error"]["message"] if openai_shape else body["detail"]
            assert "read-only (scope: read)" in message
            assert READER not in resp.text and ADMIN not in resp.text
        after = client.get("/config", headers=admin).text, client.get("/runs", headers=admin).text
        assert after == before
        wrong = client.get("/runs", headers={"Authorization": "Bearer reader-secret"})
        assert wrong.status_code == 401
        assert client.post("/environments/repeat_word/select", headers=admin).status_code == 200


def test_read_tokens_need_an_admin_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="RLCS_READ_TOKENS is set without RLCS_API_TOKEN"):
        make_settings(tmp_path, read_tokens=READER)


def test_field_counts_are_bounded(local: TestClient) -> None:
    local.post("/environments/arithmetic/select")
    before = state(local)
    many = {f"field_{i}": i for i in range(300)}
    for method, path, body in (
        ("POST", "/runs", many),
        ("PUT", "/environments/arithmetic/config", {"values": many}),
        ("POST", "/runs/r-00000000/resume", many),
    ):
        resp = local.request(method, path, json=body)
        assert resp.status_code == 422, (path, resp.text)
        assert "256" in resp.json()["detail"]
    assert state(local) == before
