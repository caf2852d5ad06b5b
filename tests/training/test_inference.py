"""Test inference through the API: sampling a trained adapter."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import SAVING_TINY_RUN, wait_for
from tests.support.settings import make_settings
from tests.test_inference import infer


def test_sampling_a_trained_adapter(tmp_path: Path) -> None:
    with TestClient(create_app(make_settings(tmp_path))) as c:
        run = c.post("/runs", json=SAVING_TINY_RUN).json()["run_id"]
        wait_for(lambda: c.get(f"/runs/{run}").json()["status"] == "succeeded", 90, every=0.3)
        checkpoints = c.get(f"/runs/{run}/checkpoints").json()
        assert [(x["step"], x["kind"]) for x in checkpoints] == [
            (1, "state"),
            (1, "sampler"),
            (2, "state"),
            (2, "sampler"),
        ]
        resp = infer(c, run_id=run, prompts=["Repeat this word: apple"], max_tokens=4)
        assert resp.status_code == 200, resp.text
        assert resp.json()["adapter"] == checkpoints[-1]["path"]
        earlier = infer(c, run_id=run, checkpoint_step=1, num_items=1, max_tokens=4)
        assert earlier.json()["adapter"] == checkpoints[1]["path"]
        missing = infer(c, run_id=run, checkpoint_step=7, prompts=["x"])
        assert missing.status_code == 404 and "1, 2" in missing.json()["detail"]
        results = c.get(f"/runs/{run}/metrics").json()
        assert results["weights_path"] == checkpoints[-1]["path"] and results["final"]
        assert len(results["history"]) == 2 and results["metrics"]["reward_mean"] is not None
        hist = c.get(f"/runs/{run}/history", params={"keys": "reward/mean,train/loss"}).json()
        assert [r["step"] for r in hist["rows"]] == [1, 2]
        assert set(hist["rows"][0]) <= {"step", "reward/mean", "train/loss"}
