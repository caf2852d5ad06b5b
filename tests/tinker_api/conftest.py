"""A live server (`python -m server`) for the real tinker SDK 0.38 to talk to, on tiny-random,
shared by the package's tests (its engine starts once); the SDK pointed at it the way a user
points a script: TINKER_BASE_URL and TINKER_API_KEY."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker

from tests.support.live_server import LiveServer

KEY = "tml-local-tests"
WAIT_S = 60.0


def tinker_server(var_dir: Path, **env: str) -> LiveServer:
    """A live server whose engine samples in float32, so its logprobs compare with the
    in-process backend's to float32 rounding."""
    return LiveServer(
        var_dir, RLCS_SAMPLING_DTYPE="float32", RLCS_DEVICE="cpu", TINKER_TELEMETRY="0", **env
    )


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with tinker_server(tmp_path_factory.mktemp("tinker-api")) as live:
        yield live


@pytest.fixture(autouse=True)
def _sdk_env(monkeypatch: pytest.MonkeyPatch, server: LiveServer) -> None:
    monkeypatch.setenv("TINKER_BASE_URL", server.url)
    monkeypatch.setenv("TINKER_API_KEY", KEY)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")


@pytest.fixture
def service() -> Iterator[tinker.ServiceClient]:
    """The unmodified SDK, configured from the environment only; its session closed after."""
    client = tinker.ServiceClient()
    yield client
    with contextlib.suppress(Exception):
        client.close("success").result(10)


def sdk_env(server: LiveServer) -> dict[str, str]:
    """The environment of a script run against `server`: ours, plus the two variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "RLCS_"))}
    return {**env, "TINKER_BASE_URL": server.url, "TINKER_API_KEY": KEY, "TINKER_TELEMETRY": "0"}
