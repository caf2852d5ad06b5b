"""A database locked past the busy timeout: writes answer 503 and change nothing."""

from __future__ import annotations

from fastapi.testclient import TestClient

from core.settings import Settings
from server.app import create_app
from tests import test_db_locked
from tests.test_db_locked import write_lock_held

# The fixtures these tests share with tests/test_db_locked.py, bound here where pytest looks.
settings = test_db_locked.settings


def test_past_the_busy_timeout_writes_answer_503_and_change_nothing(settings: Settings) -> None:
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        assert client.post("/environments/arithmetic/select").status_code == 200
        runs_before = client.get("/runs").json()
        with write_lock_held(settings, 5.0):
            assert client.get("/runs").status_code == 200  # readers are not blocked (WAL)
            for method, path, body in (
                ("POST", "/environments/repeat_word/select", None),
                ("POST", "/config", {"field": "group_size", "value": 8}),
                ("POST", "/runs", {"total_steps": 1}),
            ):
                resp = client.request(method, path, json=body)
                assert resp.status_code == 503, (path, resp.text)
                assert resp.headers["retry-after"] == "2"
                assert "Retry" in resp.json()["detail"]
        assert client.get("/config").json()["environment"] == "arithmetic"
        assert client.get("/config").json()["configurable_fields"]["group_size"] == 4
        assert client.get("/runs").json() == runs_before
        assert not any((settings.runs_dir).iterdir())  # no folder of a run that has no row
        assert client.post("/runs", json={"total_steps": 1}).status_code == 200  # and after
