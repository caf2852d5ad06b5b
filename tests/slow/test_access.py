"""Who may call, on live servers: uvicorn on every interface refuses other machines without a
token, and the operator can opt out or set one."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import httpx
import pytest

from server.guards.access import remote_peer
from tests.support.live_server import LiveServer

UVICORN_ALL_INTERFACES = [
    sys.executable,
    "-m",
    "uvicorn",
    "server.app:app",
    "--host",
    "0.0.0.0",
    "--port",
    "{port}",
]


def non_loopback_address() -> str | None:
    """An address of this machine off the loopback range (the one its default route uses)."""
    for probe in ("192.0.2.1", "10.255.255.255", "198.18.0.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.connect((probe, 9))  # UDP: no packet is sent
            except OSError:
                continue
            address = sock.getsockname()[0]
            if remote_peer(address):
                return address
    return None


ADDRESS = non_loopback_address()


needs_address = pytest.mark.skipif(
    ADDRESS is None, reason="this machine has no address outside the loopback range"
)


@needs_address
def test_uvicorn_on_all_interfaces_refuses_other_machines_without_a_token(tmp_path: Path) -> None:
    with LiveServer(tmp_path / "var", argv=UVICORN_ALL_INTERFACES) as server:
        remote = httpx.get(f"http://{ADDRESS}:{server.port}/runs", timeout=10)
        assert remote.status_code == 403
        detail = remote.json()["detail"]
        assert "RLCS_API_TOKEN" in detail and ADDRESS in detail
        # Nothing is exempt: /health and the dashboard are refused too.
        for path in ("/health", "/"):
            assert httpx.get(f"http://{ADDRESS}:{server.port}{path}", timeout=10).status_code == 403
        local = httpx.get(f"http://127.0.0.1:{server.port}/runs", timeout=10)
        assert local.status_code == 200


@needs_address
def test_the_operator_can_opt_out_or_set_a_token(tmp_path: Path) -> None:
    with LiveServer(
        tmp_path / "a", argv=UVICORN_ALL_INTERFACES, RLCS_INSECURE_NO_TOKEN="1"
    ) as server:
        assert httpx.get(f"http://{ADDRESS}:{server.port}/runs", timeout=10).status_code == 200
        assert "RLCS_INSECURE_NO_TOKEN=1" in server.log.read_text()  # said loudly at start-up
    token = "tok-access-test-0123"
    with LiveServer(tmp_path / "b", argv=UVICORN_ALL_INTERFACES, RLCS_API_TOKEN=token) as server:
        url = f"http://{ADDRESS}:{server.port}/runs"
        assert httpx.get(url, timeout=10).status_code == 401
        bearer = {"Authorization": f"Bearer {token}"}
        assert httpx.get(url, headers=bearer, timeout=10).status_code == 200
        assert httpx.get(url, auth=("anyone", token), timeout=10).status_code == 200
