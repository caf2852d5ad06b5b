"""A run whose model is in the engine host starts without torch in its own process; one whose
environment imports torch starts again with it, and one whose environment imports it only in
the middle of the run fails saying what to do (runners/train/torch_free.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.helpers import TINY_RUN, finish_run, start_run
from tests.support.live_server import LiveServer

pytestmark = pytest.mark.timeout(300)

ENV_FILE = """
import sys
{imports}
from environments.base import EnvConfig, SingleTurnEnv, Task


class Env(SingleTurnEnv):
    name = "{name}"
    Config = EnvConfig

    def get_task(self, seed, split="train"):
        return Task(prompt="Say anything", answer="")

    def score(self, prompt, response, task=None):
        return {score}
"""
# Scores 1 where the process that scores (the run's) has no torch loaded.
PROBE = ENV_FILE.format(
    imports="", name="torch_probe", score='0.0 if sys.modules.get("torch") is not None else 1.0'
)
# Scores 1 only where torch works in the run's process.
TORCH_USER = ENV_FILE.format(
    imports="import torch", name="torch_user", score="float(torch.ones(2).mean())"
)

# Imports torch only when it scores, in the middle of the run.
TORCH_LATE = ENV_FILE.format(
    imports="", name="torch_late", score="__import__('torch').ones(2).mean().item()"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("torch_free")
    envs = root / "envs"
    envs.mkdir()
    (envs / "torch_probe.py").write_text(PROBE)
    (envs / "torch_user.py").write_text(TORCH_USER)
    (envs / "torch_late.py").write_text(TORCH_LATE)
    with LiveServer(root / "var", RLCS_ENV_DIRS=json.dumps([str(envs)])) as live:
        yield live


def rewards(server: LiveServer, run_id: str) -> list[float]:
    rows = server.api.get(f"/runs/{run_id}/history").json()["rows"]
    return [row["reward/mean"] for row in rows if "reward/mean" in row]


def log_of(server: LiveServer, run_id: str) -> str:
    return server.api.get(f"/runs/{run_id}/logs", params={"tail": 500}).text


def trained(server: LiveServer, environment: str, **config: object) -> str:
    run_id = start_run(
        server.api, **TINY_RUN, environment=environment, total_steps=2, steps_per_eval=0, **config
    )
    run = finish_run(server.api, run_id)
    assert run["status"] == "succeeded", (run, log_of(server, run_id))
    return run_id


def test_a_run_on_the_engine_host_scores_in_a_process_without_torch(server: LiveServer) -> None:
    run_id = trained(server, "torch_probe")
    assert rewards(server, run_id) == [1.0, 1.0], log_of(server, run_id)
    assert "runs without torch" in log_of(server, run_id)


def test_a_private_run_holds_torch_in_its_process(server: LiveServer) -> None:
    run_id = trained(server, "torch_probe", engine="private")
    assert rewards(server, run_id) == [0.0, 0.0], log_of(server, run_id)


def test_an_environment_that_imports_torch_gets_it(server: LiveServer) -> None:
    run_id = trained(server, "torch_user")
    assert rewards(server, run_id) == [1.0, 1.0], log_of(server, run_id)
    assert "this process starts again with torch" in log_of(server, run_id)


def test_a_torch_import_in_the_middle_of_a_run_fails_it_saying_what_to_do(
    server: LiveServer,
) -> None:
    run_id = start_run(
        server.api, **TINY_RUN, environment="torch_late", total_steps=2, steps_per_eval=0
    )
    run = finish_run(server.api, run_id)
    assert run["status"] == "failed", run
    assert "import torch at the top of the environment's file" in run["error"], run
