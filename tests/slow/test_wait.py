"""GET /runs/{id}/wait for a step, then for the end, of a fake run."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi.testclient import TestClient

from tests import test_wait
from tests.test_wait import start

# The fixtures these tests share with tests/test_wait.py, bound here where pytest looks.
client = test_wait.client


def test_wait_for_a_step_then_for_the_end(client: TestClient) -> None:
    run_id = start(client, 20)
    at_step = client.get(f"/runs/{run_id}/wait", params={"until": "step:3", "timeout": 60})
    assert at_step.status_code == 200, at_step.text
    body = at_step.json()
    assert body["condition_met"] is True and 3 <= body["step"] < 20
    ended = client.get(f"/runs/{run_id}/wait", params={"until": "terminal", "timeout": 60})
    answered = datetime.now(UTC)
    body = ended.json()
    assert body["condition_met"] is True and body["status"] == "succeeded"
    finished = datetime.fromisoformat(body["finished_at"].replace("Z", "+00:00"))
    assert (answered - finished).total_seconds() < 1.0
