"""A database locked by another writer: requests wait for it, or past the busy timeout answer
503 with a retry hint; never a 500, and nothing half-done is left behind."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from server.app import create_app
from tests.support.settings import make_settings


@contextmanager
def write_lock_held(settings: Settings, seconds: float) -> Iterator[threading.Event]:
    """Another process-like writer: its own connection holds the write lock for `seconds`."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(settings.db_url.split("///", 1)[1], isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        taken.set()
        release.wait(seconds)
        conn.execute("ROLLBACK")
        conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(10)
    try:
        yield release
    finally:
        release.set()
        thread.join(10)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, db_busy_timeout_s=1.0)


def test_within_the_busy_timeout_writes_wait_and_succeed(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, db_busy_timeout_s=10.0)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        with write_lock_held(settings, 1.0):
            resp = client.post("/environments/arithmetic/select")
        assert resp.status_code == 200
