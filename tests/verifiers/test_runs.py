"""verifiers environments trained through the HTTP API on tiny-random: a 2-step run on each test
environment (single-turn and multi-turn) with its rewards, the rubric's metrics and its
rollouts recorded; an environment whose every rollout fails, and one whose process dies
mid-run, fail their runs saying why; kill -9 of a runner leaves no driver; test inference
plays and scores the environment's own examples. One server for the module: runs start
together (most of a short run is waiting)."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.helpers import (
    FINISHED,
    finish_run,
    inference_before_and_after,
    pid_alive,
    run_of,
    start_run,
    wait_for,
)
from tests.support.live_server import LiveServer
from tests.verifiers.conftest import publish, verifiers_server

TINY = {"model_name": "tiny-random", "lora_rank": 8, "use_wandb": False, "max_tokens": 10}
GOOD = ("reverse-word", "word-chain")
V1 = ("vowel-count", "vowel-duo")  # a taskset; a two-seat Env

FAILING = """import verifiers as vf
from datasets import Dataset


class Grumpy(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        raise vf.errors.InfraError("the referee walked off")


def load_environment():
    rows = [{"question": "Say hi", "answer": "hi"}]
    return Grumpy(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[]), max_turns=3)
"""
RAISES = FAILING.replace("vf.errors.InfraError", "ValueError")
MOODY = """import verifiers as vf
from datasets import Dataset


class Moody(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        if state["answer"] == "bye":
            raise vf.errors.InfraError("the referee walked off")
        return [{"role": "user", "content": "Again."}]


def load_environment():
    rows = [{"question": "Say hi", "answer": "hi"}, {"question": "Say bye", "answer": "bye"}]
    return Moody(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[]), max_turns=2)
"""
DIES = """import os

import verifiers as vf
from datasets import Dataset


class Vanishing(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        print("the environment's process is going away", flush=True)
        os._exit(3)


def load_environment():
    rows = [{"question": "Say hi", "answer": "hi"}]
    return Vanishing(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[]), max_turns=3)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, verifiers_python: str) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("verifiers-runs")
    extra = root / "more_envs"
    publish(extra, "grumpy", FAILING)
    publish(extra, "raises", RAISES)
    publish(extra, "moody", MOODY)
    publish(extra, "vanishing", DIES)
    with verifiers_server(root / "var", extra, RLCS_MAX_CONCURRENT_RUNS="6") as live:
        yield live


@pytest.fixture(scope="module")
def finished(server: LiveServer) -> dict[str, dict[str, Any]]:
    shape = {"total_steps": 2, "group_size": 3, "groups_per_step": 2}
    # SmolLM2 first (the longest): real text, whose turns merge into one sequence.
    smollm2 = {"total_steps": 2, "groups_per_step": 1, "lora_rank": 8, "use_wandb": False}
    ids = {
        "smollm2": start_run(
            server.api, environment="word-chain", group_size=3, max_tokens=12, **smollm2
        ),
        "smollm2-v1": start_run(
            server.api, environment="vowel-count", group_size=2, max_tokens=8, **smollm2
        ),
    }
    ids.update(
        (name, start_run(server.api, environment=name, **shape, **TINY))
        for name in (*GOOD, *V1, "letter-count", "grumpy", "moody", "raises", "vanishing")
    )
    wait_for(lambda: all(run_of(server.api, i)["status"] in FINISHED for i in ids.values()), 300)
    return {name: run_of(server.api, run_id) for name, run_id in ids.items()}


def log_of(server: LiveServer, run: dict[str, Any]) -> str:
    return "\n".join(server.api.get(f"/runs/{run['run_id']}/logs?tail=60").json()["lines"])


@pytest.mark.parametrize("name", GOOD)
def test_a_two_step_run_records_rewards_metrics_and_rollouts(
    server: LiveServer, finished: dict[str, dict[str, Any]], name: str
) -> None:
    run = finished[name]
    assert run["status"] == "succeeded", log_of(server, run)
    assert run["step"] == 2 and run["metrics"]["reward_mean"] is not None
    rows = server.api.get(f"/runs/{run['run_id']}/history").json()["rows"]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    rubric = ("env/similarity", "env/brevity") if name == "reverse-word" else ("env/chained",)
    for row in steps:
        assert row["env/num_groups"] == 2 and row["env/num_episodes"] == 6
        # A rollout verifiers itself failed (tiny-random answering nothing at all: its
        # EmptyModelResponseError) is left out of training; every other one trains.
        assert row.get("verifiers/dropped/error", 0.0) == row["verifiers/errors"] < 6
        assert "verifiers/dropped/no_tokens" not in row
        assert all(key in row for key in rubric)  # the rubric's own metrics
        # Every model call came back with its token ids and logprobs: what was sampled is
        # what trains (the face served each completion, its tokens counted).
        # A rollout that failed on an empty first answer made no second call (word-chain's).
        calls = 6 if name == "reverse-word" else 12
        failed_early = 0 if name == "reverse-word" else row["verifiers/errors"]
        assert calls - failed_early <= row["verifiers/face_requests"] <= calls
        assert row["verifiers/face_tokens"] > 0
    # Rewards that vary (the rubric's are continuous) teach: a step trained on them, on the
    # sampler's own logprobs (what the trainer computes for the same tokens).
    trained = [r for r in steps if "train/loss" in r]
    assert trained
    assert all(abs(r["train/kl_sample_train_v1"]) < 0.05 for r in trained)
    items = server.api.get(f"/runs/{run['run_id']}/rollouts", params={"step": 1}).json()["items"]
    assert len(items) == 6 and {i["group"] for i in items} == {0, 1}
    assert sum(i["reward"] for i in items) / 6 == pytest.approx(steps[0]["reward/mean"])
    assert all((i["advantage"] is None) != i["trained"] for i in items)
    # A rollout verifiers failed (an empty answer, counted in verifiers/errors above) ends at
    # its prompt; every other ends with the model's answer.
    answered = [i for i in items if i["messages"][-1]["role"] == "assistant"]
    assert len(answered) == 6 - steps[0]["verifiers/errors"]
    first = answered[0]
    assert first["kind"] == "episode"
    if name == "word-chain":
        assert first["turns"] == 2
        assert any("Now a word that starts with" in m["content"] for m in first["messages"])
    else:
        assert first["prompt"].startswith("Write the word '")


@pytest.mark.parametrize("name", V1)
def test_a_v1_environment_trains_each_seat_a_sample(
    server: LiveServer, finished: dict[str, dict[str, Any]], name: str
) -> None:
    """Its tasks played by verifiers' own Env (the null harness in a subprocess, its model
    calls through verifiers' train client to the face's /inference/v1/generate), each seat's
    trace a sample with the sampler's logprobs."""
    run = finished[name]
    assert run["status"] == "succeeded", log_of(server, run)
    rows = server.api.get(f"/runs/{run['run_id']}/history").json()["rows"]
    steps = [r for r in rows if "reward/mean" in r]
    seats = 2 if name == "vowel-duo" else 1
    for row in steps:
        assert row["env/num_episodes"] == 6 * seats and "env/right" in row
        errors = row["verifiers/errors"]
        assert row.get("verifiers/dropped/error", 0.0) == errors < 6 * seats
        # One model call a seat; a seat whose run failed before its call made none, and is an
        # error (seen in loaded CI runs, the cause not found here: the run's log now says it).
        calls = row["verifiers/face_requests"]
        assert 6 * seats - errors <= calls <= 6 * seats, (row, log_of(server, run))
    trained = [r for r in steps if "train/loss" in r]
    assert trained
    assert all(abs(r["train/kl_sample_train_v1"]) < 0.05 for r in trained)
    items = server.api.get(f"/runs/{run['run_id']}/rollouts", params={"step": 1}).json()["items"]
    assert len(items) == 6 * seats
    # A failed seat's rollout has no chat (it never reached the model); the log says why.
    played = [i["prompt"] for i in items if i["prompt"]]
    assert len(played) >= 6 * seats - steps[0]["verifiers/errors"], log_of(server, run)
    assert all("How many vowels are in" in prompt for prompt in played)
    if any(row["verifiers/errors"] for row in steps):
        assert "failed in the environment and are left out" in log_of(server, run)


def test_a_tool_environment_on_a_model_without_a_tool_format_says_so(
    server: LiveServer, finished: dict[str, dict[str, Any]]
) -> None:
    """tiny-random's chat template has no tool format: the tools are not shown, the model
    answers text (each episode ends there), and every such request is counted and logged."""
    run = finished["letter-count"]
    assert run["status"] == "succeeded", log_of(server, run)
    rows = server.api.get(f"/runs/{run['run_id']}/history").json()["rows"]
    steps = [r for r in rows if "reward/mean" in r]
    for row in steps:
        assert row["verifiers/face_tools_unsupported"] == row["verifiers/face_requests"] == 6
        assert row["env/total_tool_calls"] == 0  # verifiers' own count: none parsed
    assert "has no tool format" in log_of(server, run)


def test_smollm2_trains_a_multi_turn_environment_its_turns_merged(
    server: LiveServer, finished: dict[str, dict[str, Any]]
) -> None:
    run = finished["smollm2"]
    assert run["status"] == "succeeded", log_of(server, run)
    assert run["model_name"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    rows = server.api.get(f"/runs/{run['run_id']}/history").json()["rows"]
    trained = [r for r in rows if "train/num_datums" in r]
    assert trained
    # Three episodes of two turns each: a turn's prompt extends the turn before (the chat
    # template renders the model's answer as it sampled it), so most episodes train as one
    # sequence, not one per turn.
    assert all(r["train/num_datums"] < 2 * r["env/num_episodes"] for r in trained)


def test_smollm2_trains_a_v1_taskset(
    server: LiveServer, finished: dict[str, dict[str, Any]]
) -> None:
    """verifiers' renderer builds SmolLM2's prompts from its own tokenizer folder, and what the
    face samples for them trains."""
    run = finished["smollm2-v1"]
    assert run["status"] == "succeeded", log_of(server, run)
    rows = server.api.get(f"/runs/{run['run_id']}/history").json()["rows"]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["verifiers/face_requests"] == 2 and "env/right" in r for r in steps)
    for row in (r for r in steps if "train/loss" in r):
        assert abs(row["train/kl_sample_train_v1"]) < 0.05


def test_an_environment_whose_every_rollout_fails_fails_the_run(
    finished: dict[str, dict[str, Any]],
) -> None:
    run = finished["grumpy"]
    assert run["status"] == "failed" and run["failure_kind"] == "environment", run
    assert "every rollout of step 1 failed in the environment" in run["error"]
    assert "the referee walked off" in run["error"]


def test_rollouts_that_fail_are_left_out_and_the_log_says_why(
    server: LiveServer, finished: dict[str, dict[str, Any]]
) -> None:
    """Each step's 'bye' group fails in the environment (the 'hi' one plays on): the run goes
    on without those rollouts, and its log says how many failed and why."""
    run = finished["moody"]
    assert run["status"] == "succeeded", log_of(server, run)
    rows = server.api.get(f"/runs/{run['run_id']}/history").json()["rows"]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # tiny-random may also answer nothing ('hi' rollouts then fail too), never all of them.
    assert all(3 <= r["verifiers/errors"] == r["verifiers/dropped/error"] < 6 for r in steps)
    log = log_of(server, run)
    for step in (1, 2):
        assert re.search(rf"step {step}: [3-5] of 6 rollouts failed in the environment", log), log
    assert "the referee walked off" in log or "EmptyModelResponse" in log


def test_an_environment_that_raises_fails_the_run_saying_what(
    finished: dict[str, dict[str, Any]],
) -> None:
    run = finished["raises"]
    assert run["status"] == "failed" and run["failure_kind"] == "environment", run
    assert run["error"] == "the environment failed: ValueError: the referee walked off"


def test_an_environment_whose_process_dies_fails_the_run_with_its_log(
    finished: dict[str, dict[str, Any]],
) -> None:
    run = finished["vanishing"]
    assert run["status"] == "failed" and run["failure_kind"] == "environment", run
    assert "driver ended" in run["error"]
    assert "the environment's process is going away" in run["error"]


def test_kill_9_of_a_run_leaves_no_driver(server: LiveServer) -> None:
    from tests.support.helpers import processes_with

    run_id = start_run(
        server.api, environment="reverse-word", total_steps=500, group_size=2, **TINY
    )
    run = wait_for(lambda: (r := run_of(server.api, run_id))["step"] >= 1 and r, 120)
    driver = wait_for(lambda: processes_with("drive.py", f"{run_id}/verifiers"), 10)
    os.kill(run["pid"], signal.SIGKILL)
    assert finish_run(server.api, run_id)["status"] == "failed"
    wait_for(lambda: not any(pid_alive(p) for p in driver), 15)


def test_test_inference_scores_the_environments_own_examples(
    server: LiveServer, finished: dict[str, dict[str, Any]]
) -> None:
    run_id = finished["reverse-word"]["run_id"]
    for out in inference_before_and_after(server.api, "reverse-word", run_id, 2, 90):
        results = out["results"]
        assert len(results) == 2
        assert [r["prompt"] for r in results] == [
            "Write the word 'planet' backwards.",
            "Write the word 'garden' backwards.",
        ]
        for result in results:
            assert isinstance(result["score"], float) and 0.0 <= result["score"] <= 1.0
            assert result["tokens"] <= 8 and result["turns"][-1]["role"] == "assistant"
        # tiny-random may end an answer at once (its end token sampled first); not both.
        assert sum(r["tokens"] for r in results) >= 1, results
    tried = server.api.post(
        "/test/inference",
        json={
            "environment": "vowel-count",
            "model": "tiny-random",
            "num_items": 2,
            "max_tokens": 6,
        },
        timeout=120,
    )
    assert tried.status_code == 200, tried.text
    results = tried.json()["results"]
    assert [r["prompt"] for r in results] == [
        "How many vowels are in 'banana'?",
        "How many vowels are in 'kiwi'?",
    ]
    assert all(isinstance(r["score"], float) for r in results)
    free = server.api.post(
        "/test/inference",
        json={
            "environment": "word-chain",
            "model": "tiny-random",
            "prompts": ["Hi"],
            "max_tokens": 4,
        },
        timeout=90,
    )
    assert free.status_code == 200, free.text
    (result,) = free.json()["results"]
    assert result["score"] is None and "num_items" in result["reason"]
