"""Fixtures for the adapter tests: an API client, and a loopback OpenReward server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.settings import make_settings

# The SDK would otherwise ask PyPI for its latest version from every client and server.
os.environ["OPENREWARD_DISABLE_UPDATE_CHECK"] = "1"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(tmp_path))) as client:
        yield client


@pytest.fixture(scope="session")
def openreward_url() -> Iterator[str]:
    from tests.support.loopback_openreward import serve

    with serve() as url:
        yield url
