"""Several engine hosts on one machine (issue 52), with real processes and signals: with
RLCS_ENGINE_HOSTS=2, runs on bases X, Y, X make exactly two hosts, X loaded once and Y once; a
host killed with `kill -9` fails over only its own clients (the other's runs lose no step, its
runs resume by themselves); and an environment that calls os._exit during a test inference takes
down the inference client, not a host, so a run training beside it ends well.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from core import engine_host
from core.engine_slots import GIB
from core.model_names import weight_bytes
from tests.slow.test_engine_host import steps_recorded
from tests.support.helpers import TINY_RUN, finish_run, run_of, start_run, wait_for
from tests.support.live_server import LiveServer

pytestmark = pytest.mark.timeout(600)
RUN = {**TINY_RUN, "environment": "repeat_word", "save_every": 2, "steps_per_eval": 0}


def saved_tiny(folder: Path) -> str:
    """A base model of its own: tiny-random's shape saved as a local folder (its size is
    known on disk, as a downloaded model's is)."""
    from runners.models.tiny import build_tiny

    model, tokenizer = build_tiny()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def other_base(tmp_path_factory: pytest.TempPathFactory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("bases") / "tiny-copy")


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[LiveServer]:
    with LiveServer(
        tmp_path / "var", RLCS_ENGINE_HOSTS="2", RLCS_MAX_CONCURRENT_RUNS="4"
    ) as server:
        yield server


def hosts(server: LiveServer) -> list[dict]:
    return server.api.get("/engine").json()["hosts"]


def host_processes(server: LiveServer) -> list[int]:
    """The pids of the live engine hosts recorded under the server's var folder."""
    records = [engine_host.read_record(home) for home in engine_host.recorded(server.var_dir)]
    return [r.pid for r in records if r is not None and r.alive]


def holder(server: LiveServer, base: str) -> dict:
    """The one host holding `base`. A host's warm-up holds tiny-random for a moment as the
    host starts (runners/engine_host/warm_up.py): a second holder is waited out."""
    found: list[dict] = []

    def one() -> bool:
        found[:] = [h for h in hosts(server) if any(b["name"] == base for b in h["bases"])]
        return len(found) == 1

    wait_for(one, 60, every=0.2)
    return found[0]


def test_two_bases_on_two_hosts_and_a_killed_host_fails_over_its_own_runs_only(
    two_hosts: LiveServer, other_base: str
) -> None:
    server = two_hosts
    steps = 150  # tiny-random's steps take a tenth of a second: long enough to kill mid-run
    bases = ["tiny-random", other_base, "tiny-random"]
    runs = [
        start_run(server.api, **{**RUN, "model_name": base}, total_steps=steps, seed=i)
        for i, base in enumerate(bases)
    ]
    wait_for(lambda: all(run_of(server.api, r)["step"] >= 3 for r in runs), 240, every=0.2)

    assert len(host_processes(server)) == 2
    x, y = holder(server, "tiny-random"), holder(server, other_base)
    assert x["name"] != y["name"]
    assert [b["name"] for b in x["bases"]] == ["tiny-random"]  # each loaded once, apart
    assert [b["name"] for b in y["bases"]] == [other_base]
    assert sorted((lane["base"], lane["lane"]) for lane in x["lanes"]) == [
        ("tiny-random", 0),
        ("tiny-random", 1),
    ]
    assert {c["client"] for c in x["clients"] if c["role"] == "run"} == {
        f"run {runs[0]}",
        f"run {runs[2]}",
    }
    assert {c["client"] for c in y["clients"] if c["role"] == "run"} == {f"run {runs[1]}"}

    os.kill(y["pid"], signal.SIGKILL)
    for run_id in runs:
        run = finish_run(server.api, run_id, timeout=300)
        assert run["status"] == "succeeded", run
        assert steps_recorded(server, run_id) == list(range(1, steps + 1))
    assert "resumed by itself" in (run_of(server.api, runs[1])["details"] or "")
    for run_id in (runs[0], runs[2]):  # the other host's runs never noticed
        assert "resumed" not in (run_of(server.api, run_id)["details"] or "")
    assert x["pid"] in host_processes(server)  # the same host all along


EXITS = '''
"""Scores by ending the process that scores it."""

import os

from environments.base import SingleTurnEnv, Task


class ExitsWhenScoring(SingleTurnEnv):
    """An environment whose score() calls os._exit."""

    name = "exits_when_scoring"

    def get_task(self, seed, split="train"):
        return Task(prompt="Say anything", answer="")

    def score(self, prompt, response, task=None):
        os._exit(3)
'''


def test_an_environment_that_exits_in_test_inference_leaves_the_hosts_and_runs_alone(
    tmp_path: Path,
) -> None:
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "exits_when_scoring.py").write_text(EXITS)
    with LiveServer(tmp_path / "var", RLCS_ENV_DIRS=json.dumps([str(envs)])) as server:
        run_id = start_run(server.api, **RUN, total_steps=60)
        wait_for(lambda: run_of(server.api, run_id)["step"] >= 2, 120, every=0.2)
        host = engine_host.running(server.var_dir)
        assert host is not None
        answer = server.api.post(
            "/test/inference",
            json={
                "environment": "exits_when_scoring",
                "model": "tiny-random",
                "prompts": ["hi"],
                "max_tokens": 4,
            },
            timeout=120,
        )
        assert answer.status_code == 503, answer.text
        assert "inference client" in answer.json()["detail"], answer.text
        assert "exit code 3" in answer.json()["detail"], answer.text
        run = finish_run(server.api, run_id, timeout=300)
        assert run["status"] == "succeeded", run
        assert "resumed" not in (run["details"] or "")
        assert engine_host.running(server.var_dir) == host  # the same host throughout
        again = server.api.post(
            "/test/inference",
            json={"environment": "repeat_word", "model": "tiny-random", "prompts": ["hi"]},
            timeout=120,
        )
        assert again.status_code == 200, again.text  # a new inference client answers


def test_a_run_waits_queued_naming_the_hosts_until_one_has_room(tmp_path: Path) -> None:
    first, second = saved_tiny(tmp_path / "first"), saved_tiny(tmp_path / "second")
    size = weight_bytes(first, tmp_path)
    assert size is not None
    room = 1.5 * size / GIB  # one of the two bases fits the host, not both
    with LiveServer(tmp_path / "var", RLCS_ENGINE_MEMORY_BUDGET_GB=f"{room:.9f}") as server:
        holding = start_run(server.api, **{**RUN, "model_name": first}, total_steps=40)
        wait_for(lambda: run_of(server.api, holding)["step"] >= 1, 120, every=0.2)
        waiting = start_run(server.api, **{**RUN, "model_name": second}, total_steps=2)
        said = "waiting for room on an engine host"
        reason = wait_for(lambda: said in (d := run_of(server.api, waiting)["details"] or "") and d)
        assert run_of(server.api, waiting)["status"] == "queued", reason
        assert first in reason, reason
        assert f"{server.api.get('/engine').json()['node']}/0 (cpu)" in reason
        assert finish_run(server.api, holding, 300)["status"] == "succeeded"
        run = finish_run(server.api, waiting, 300)
        assert run["status"] == "succeeded" and run["details"] is None, run


def test_a_base_larger_than_every_hosts_budget_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    base = saved_tiny(tmp_path / "base")
    size = weight_bytes(base, tmp_path)
    assert size is not None
    with LiveServer(
        tmp_path / "var", RLCS_ENGINE_MEMORY_BUDGET_GB=f"{size / 2 / GIB:.9f}"
    ) as server:
        refused = server.api.post("/runs", json={**RUN, "model_name": base})
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"]
        assert "model_name" in detail and "fits no engine host" in detail, detail
        assert "RLCS_ENGINE_MEMORY_BUDGET_GB" in detail
        assert server.api.get("/runs").json() == []  # nothing made
