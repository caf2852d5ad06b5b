"""`rlctl sweeps ...` and `rlctl runs fork` against a live server with the fake runner."""

from __future__ import annotations

import json

from cli.sweeps import grid_axis
from tests.cli.conftest import Rlctl


def test_grid_values_parse_like_config_values() -> None:
    assert grid_axis("learning_rate=1e-5,4e-5") == ("learning_rate", [1e-5, 4e-5])
    assert grid_axis("seed=[0, 1, 2]") == ("seed", [0, 1, 2])
    assert grid_axis("model_name=gpt2,tiny-random") == ("model_name", ["gpt2", "tiny-random"])


def test_fork_sends_the_step_and_overrides(rlctl: Rlctl) -> None:
    run = json.loads(
        rlctl("--json", "runs", "start", "--env", "arithmetic", "--set", "total_steps=2").stdout
    )["run_id"]
    assert rlctl("runs", "wait", run, "--at-most", "60").returncode == 0
    # The fake runner saves no checkpoint: the server says so, rlctl exits 1 with its words.
    forked = rlctl("runs", "fork", run, "--set", "total_steps=4", "--step", "2")
    assert forked.returncode == 1 and "no state checkpoint to fork from" in forked.stderr
    bad = rlctl("runs", "fork", run, "--set", "lora_rank=4")
    assert bad.returncode == 1 and "lora_rank" in bad.stderr
