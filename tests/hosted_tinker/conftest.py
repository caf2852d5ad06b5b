"""Fixtures: a hosted-Tinker stand-in per test, and the SDK's telemetry switched off."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest
import tinker

from tests.support.standins.tinker_standin import TinkerStandin

TEST_KEY = "tml-standin-test-key-0123456789"


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK reads these itself; keep it off telemetry and off any ambient key or URL.
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)


@pytest.fixture
def standin() -> Iterator[TinkerStandin]:
    with TinkerStandin(expected_api_key=TEST_KEY) as server:
        yield server


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL where nothing listens: the port was bound, then released."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def sdk(standin: TinkerStandin) -> Iterator[tinker.ServiceClient]:
    """The unmodified SDK pointed at the stand-in; its session is finished afterwards."""
    client = tinker.ServiceClient(base_url=standin.url, api_key=TEST_KEY)
    yield client
    with contextlib.suppress(Exception):
        client.close("success").result(5)
