"""Atropos environments trained through the HTTP API on tiny-random: a 3-step run on each test
environment with its rewards recorded, one that never yields a group (stalled, then failed,
saying why), environments that crash or hang at their start, stop and kill -9 leaving no
process of the three, test inference on the base model and on a run's checkpoint, and
everything else seeing these runs as runs (sweeps, forks, resumes, webhooks, /v1, MCP, rlctl).
One server for the module: runs start together (most of a short run is waiting)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from core.settings import PROJECT_ROOT
from tests.atropos.conftest import atropos_server
from tests.support.helpers import (
    FINISHED,
    finish_run,
    inference_before_and_after,
    pid_alive,
    processes_with,
    run_of,
    start_run,
    wait_for,
)
from tests.support.live_server import LiveServer
from tests.support.mcp_client import call, http_session
from tests.support.standins.webhook_receiver import WebhookReceiver

TINY = {"model_name": "tiny-random", "lora_rank": 8, "use_wandb": False, "groups_per_step": 2}
GOOD = ("word_echo", "chat_dialogue", "counting")
# One run also lets its environment run 2 batches ahead, with a KL penalty and gspo.
OWN = {"counting": {"max_steps_off_policy": 2, "kl_penalty_coef": 0.1, "loss_fn": "gspo"}}

CRASHES = '''
"""Fails in its setup, as an environment whose data is missing does."""
from atroposlib.envs.base import BaseEnv

class CrashesEnv(BaseEnv):
    name = "crashes"

    async def setup(self):
        raise RuntimeError("the data file was not found")

    async def get_next_item(self):
        return None

    async def evaluate(self, *args, **kwargs):
        return None

if __name__ == "__main__":
    CrashesEnv.cli()
'''
HANGS = (
    CRASHES.replace("CrashesEnv", "HangsEnv")
    .replace('"crashes"', '"hangs"')
    .replace(
        'raise RuntimeError("the data file was not found")',
        "import asyncio\n        await asyncio.sleep(3600)",
    )
)


@dataclass
class Finished:
    runs: dict[str, dict[str, Any]]
    said_stalled: dict[str, str] = field(default_factory=dict)  # details seen while running


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    standin = WebhookReceiver().start()
    yield standin
    standin.stop()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, atropos_python: str, receiver: WebhookReceiver
) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("atropos-runs")
    extra = root / "more_envs"
    extra.mkdir()
    (extra / "crashes_env.py").write_text(CRASHES)
    (extra / "hangs_env.py").write_text(HANGS)
    with atropos_server(
        root / "var",
        extra,
        RLCS_MAX_CONCURRENT_RUNS="6",
        RLCS_ATROPOS_STALL_S="20",
        RLCS_ATROPOS_START_TIMEOUT_S="45",
        RLCS_STOP_GRACE_S="30",
    ) as live:
        hook = {"url": f"{receiver.url}/hook", "events": ["run.succeeded", "run.failed"]}
        assert live.api.post("/webhooks", json=hook).status_code == 200
        yield live


@pytest.fixture(scope="module")
def finished(server: LiveServer) -> Finished:
    """Every environment's run, started at once (most of a short run is waiting), until all
    have ended; the details each said while it was running."""
    # The one that waits longest (for RLCS_ATROPOS_START_TIMEOUT_S) starts first.
    names = ("hangs", "crashes", "flat_scores", *GOOD)
    ids = {
        name: start_run(server.api, environment=name, total_steps=3, **TINY, **OWN.get(name, {}))
        for name in names
    }
    said: dict[str, str] = {}

    def all_ended() -> bool:
        ended = True
        for name, run_id in ids.items():
            run = run_of(server.api, run_id)
            if run["status"] == "running" and (run["details"] or "").startswith("stalled"):
                said.setdefault(name, run["details"])
            ended = ended and run["status"] in FINISHED
        return ended

    wait_for(all_ended, 400, every=0.2)
    return Finished({name: run_of(server.api, run_id) for name, run_id in ids.items()}, said)


def log_of(server: LiveServer, run: dict[str, Any]) -> str:
    lines = server.api.get(f"/runs/{run['run_id']}/logs?tail=60").json()["lines"]
    return "\n".join(lines)


@pytest.mark.parametrize("name", GOOD)
def test_a_three_step_run_records_its_rewards(
    server: LiveServer, finished: Finished, name: str
) -> None:
    run = finished.runs[name]
    assert run["status"] == "succeeded", log_of(server, run)
    assert run["step"] == 3 and run["metrics"]["reward_mean"] is not None
    rows = server.api.get(f"/runs/{run['run_id']}/history").json()["rows"]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for row in steps:
        assert 0.0 <= row["reward/mean"] <= 1.1
        assert row["atropos/groups_received"] >= 2 and "train/loss" in row
        assert row["env/num_episodes"] >= 2 * row["env/num_groups"] - 1e-9
    results = server.api.get(f"/runs/{run['run_id']}/metrics").json()
    assert results["weights_path"] and results["checkpoints"]
    # Its cost counts what its face sampled for the environment (and what was sampled after the
    # last step's count), and what it trained.
    cost = run["cost"]
    face = sum(r.get("atropos/face_tokens", 0) for r in rows)
    assert cost["tokens_sampled"] >= face > 0 and cost["tokens_trained"] > 0, cost
    assert cost["device_s"] > 0 and cost["tokens_prefill"] > 0
    keys = {k for r in rows for k in r}
    if name == "word_echo":  # what the environment logs to W&B itself (its wandb_log)
        assert "atropos/train/percent_correct" in keys
    if name == "chat_dialogue":  # sampled through /v1: the sampler's logprobs recomputed
        assert max(r.get("atropos/recomputed_logprobs", 0) for r in rows) > 0
    else:  # through managed_server: the environment sent them
        assert all(r.get("atropos/recomputed_logprobs", 0) == 0 for r in rows)
        # ... and its tokens are the face's: each group's policy is known.
        bound = max(1, OWN.get(name, {}).get("max_steps_off_policy", 0))
        for row in steps:
            assert 0 <= row["sampler/steps_off_policy"] <= row["sampler/steps_off_policy_max"]
            assert row["sampler/steps_off_policy_max"] <= bound
            assert "sampler/untagged_groups" not in row
    if name in OWN:
        assert all("kl/reference" in row for row in steps)


def test_an_environment_that_never_yields_a_group_says_so_then_fails(
    server: LiveServer, finished: Finished
) -> None:
    run = finished.runs["flat_scores"]
    assert run["status"] == "failed" and run["failure_kind"] == "stalled", run
    assert "every score in the group was the same" in run["error"]
    assert "RLCS_ATROPOS_STALL_S" in run["error"]
    assert "every score in the group was the same" in finished.said_stalled["flat_scores"]


def test_an_environment_that_crashes_at_its_start_fails_the_run_with_its_log(
    finished: Finished,
) -> None:
    run = finished.runs["crashes"]
    assert run["status"] == "failed" and run["failure_kind"] == "environment", run
    assert "the environment ended" in run["error"]
    assert "RuntimeError: the data file was not found" in run["error"]


def test_an_environment_that_hangs_at_its_start_fails_the_run(finished: Finished) -> None:
    run = finished.runs["hangs"]
    assert run["status"] == "failed" and run["failure_kind"] == "environment", run
    assert "asked for no completion within 45 s" in run["error"]


def three_processes(server: LiveServer, run_id: str) -> list[int]:
    """The run's runner, its trajectory API and its environment."""
    run = wait_for(lambda: (r := run_of(server.api, run_id))["step"] >= 1 and r, 120)
    runner = run["pid"]
    api = wait_for(lambda: processes_with("atroposlib.api:app", parent=runner), 10)
    env = wait_for(lambda: processes_with(f"{run_id}/atropos/env.yaml", parent=runner), 10)
    return [runner, *api, *env]


def test_stop_and_kill_9_leave_no_process_of_the_three(server: LiveServer) -> None:
    stopped = start_run(server.api, environment="word_echo", total_steps=200, **TINY)
    killed = start_run(server.api, environment="counting", total_steps=200, **TINY)
    to_stop = three_processes(server, stopped)
    to_kill = three_processes(server, killed)
    assert len(to_stop) == len(to_kill) == 3

    assert server.api.post(f"/runs/{stopped}/stop").json()["status"] == "stopping"
    os.kill(to_kill[0], signal.SIGKILL)
    ended = {run_id: finish_run(server.api, run_id) for run_id in (stopped, killed)}
    assert ended[stopped]["status"] == "stopped", ended[stopped]
    assert ended[killed]["status"] == "failed", ended[killed]
    wait_for(lambda: not [p for p in to_stop + to_kill if pid_alive(p)], 15)
    # A stopped run keeps its last checkpoint, to resume or to sample from.
    assert server.api.get(f"/runs/{stopped}/checkpoints").json()


def test_test_inference_scores_the_environments_own_items(
    server: LiveServer, finished: Finished
) -> None:
    run_id = finished.runs["word_echo"]["run_id"]
    for out in inference_before_and_after(server.api, "word_echo", run_id, 1, 60):
        results = out["results"]
        assert len(results) == 4  # one item, its group of four, each scored
        for result in results:
            assert isinstance(result["score"], float) and 0.0 <= result["score"] <= 1.0
            assert "Repeat this word:" in result["prompt"] and result["tokens"] <= 8
        assert out["summary"]["scored"] == 4


def test_free_prompts_are_answered_and_say_why_they_are_not_scored(
    server: LiveServer, atropos_python: str
) -> None:
    answer = server.api.post(
        "/test/inference",
        json={
            "environment": "counting",
            "model": "tiny-random",
            "prompts": ["Count: 1 to 3:", "Count: 1 to 2:"],
            "max_tokens": 6,
        },
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["prompt"] for r in results] == ["Count: 1 to 3:", "Count: 1 to 2:"]
    for result in results:
        assert result["score"] is None and "num_items" in result["reason"]
        assert result["tokens"] <= 6
    # tiny-random may end an answer at once (its end token sampled first); not both.
    assert sum(r["tokens"] for r in results) >= 1, results


def test_sweeps_forks_resumes_webhooks_v1_mcp_and_rlctl_see_runs(
    server: LiveServer, finished: Finished, receiver: WebhookReceiver
) -> None:
    api = server.api
    run_id = finished.runs["word_echo"]["run_id"]
    sweep = api.post(
        "/sweeps",
        json={
            "environment": "counting",
            "base": {"total_steps": 1, **TINY},
            "grid": {"learning_rate": [1e-4, 1e-3]},
        },
    )
    assert sweep.status_code == 200, sweep.text
    fork = api.post(f"/runs/{run_id}/fork", json={"total_steps": 4, "seed": 3})
    assert fork.status_code == 200, fork.text
    resumed = api.post(f"/runs/{run_id}/resume", json={"total_steps": 4, "force": True})
    assert resumed.status_code == 200 and resumed.json()["resume_step"] == 3, resumed.text

    forked = finish_run(api, fork.json()["run_id"], 300)
    assert forked["status"] == "succeeded", forked
    assert forked["parent_run_id"] == run_id and forked["parent_step"] == 3
    assert forked["step"] == 4
    again = finish_run(api, run_id, 300)
    assert again["status"] == "succeeded" and again["step"] == 4 and again["attempt"] == 2
    done = api.get(f"/sweeps/{sweep.json()['sweep_id']}/wait?timeout=300", timeout=320).json()
    assert [r["status"] for r in done["runs"]] == ["succeeded", "succeeded"], done

    models = {m["id"] for m in api.get("/v1/models").json()["data"]}
    assert run_id in models
    chat = api.post(
        "/v1/chat/completions",
        json={
            "model": run_id,
            "messages": [{"role": "user", "content": "Repeat this word: apple"}],
            "max_tokens": 4,
        },
    )
    assert chat.status_code == 200 and chat.json()["choices"], chat.text

    async def listed_by_mcp() -> list[dict[str, Any]]:
        async with http_session(server.url) as session:
            return (await call(session, "rl_list_environments")).data["environments"]

    by_mcp = {e["name"]: e for e in asyncio.run(listed_by_mcp())}
    assert by_mcp["word_echo"]["framework"] == "atropos"

    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCS_")}
    rlctl = subprocess.run(
        [sys.executable, "-m", "cli", "--json", "runs", "list"],
        cwd=PROJECT_ROOT,
        env={**env, "RLCS_URL": server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rlctl.returncode == 0, rlctl.stderr
    assert run_id in {r["run_id"] for r in json.loads(rlctl.stdout)}

    def delivered() -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for got in receiver.accepted():
            out.setdefault(got.event, set()).add(got.json["run"]["run_id"])
        return out

    stalled = finished.runs["flat_scores"]["run_id"]
    wait_for(
        lambda: (
            run_id in delivered().get("run.succeeded", set())
            and stalled in delivered().get("run.failed", set())
        ),
        30,
    )
