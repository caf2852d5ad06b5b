"""A model gone by the time the run starts fails with a clear reason."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests import test_training
from tests.support.helpers import TINY_RUN as TINY
from tests.support.helpers import finish_run as finish
from tests.support.helpers import start_run as start

# The fixtures these tests share with tests/test_training.py, bound here where pytest looks.
tclient = test_training.tclient


def test_a_model_gone_by_the_time_the_run_starts_fails_with_a_clear_reason(
    tclient: TestClient, tmp_path: Path
) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    run_id = start(
        tclient, environment="arithmetic", total_steps=1, **{**TINY, "model_name": str(folder)}
    )
    (folder / "config.json").unlink()  # the runner needs a second or more to get that far
    folder.rmdir()
    run = finish(tclient, run_id)
    assert run["status"] == "failed" and run["failure_kind"] == "model", run
    assert "my-model" in run["error"]
