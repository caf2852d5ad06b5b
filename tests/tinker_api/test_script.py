"""A training script written for Tinker (in the style of the GEM trainer), run unchanged as a
subprocess with only TINKER_BASE_URL and TINKER_API_KEY pointing it at the server: it trains,
checkpoints, and its session shows up as a run with its steps and checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import sdk_env

pytestmark = pytest.mark.timeout(240)
SCRIPT = Path(__file__).with_name("guess_train.py")


def test_a_tinker_script_trains_here_unchanged(server: LiveServer, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "max_steps=2", "batch_size=6", f"log_dir={tmp_path}"],
        env=sdk_env(server),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [s["step"] for s in steps] == [0, 1]
    assert all("train/loss:sum" in s and abs(s["kl_sample_train_v1"]) < 1e-3 for s in steps)

    index = [json.loads(line) for line in (tmp_path / "checkpoints.jsonl").read_text().splitlines()]
    assert [r["name"] for r in index] == ["000001", "000002"]
    run_id = index[0]["state_path"].removeprefix("tinker://").split(":")[0]
    run = server.api.get(f"/runs/{run_id}").json()
    assert (run["source"], run["step"], run["model_name"]) == ("tinker-api", 2, "tiny-random")
    kinds = {(c["kind"], c["name"]) for c in server.api.get(f"/runs/{run_id}/checkpoints").json()}
    assert {("state", "000001"), ("state", "000002"), ("sampler", "000000")} <= kinds
    history = server.api.get(f"/runs/{run_id}/history").json()["rows"]
    assert [row["step"] for row in history] == [1, 2]
    assert all(row["sampler/tokens"] > 0 and row["train/tokens"] > 0 for row in history)
