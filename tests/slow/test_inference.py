"""Test inference through the API with the warm worker: items, multi-turn episodes, the
reference client's call, a worker that dies."""

from __future__ import annotations

import os
import signal

import pytest
from fastapi.testclient import TestClient

from environments.arithmetic import ArithmeticEnv
from environments.repeat_word import RepeatWordEnv
from tests import test_inference
from tests.support.helpers import wait_for
from tests.test_inference import infer

# The fixtures these tests share with tests/test_inference.py, bound here where pytest looks.
iclient = test_inference.iclient


def test_reference_client_call_and_warm_worker(iclient: TestClient) -> None:
    worker = iclient.app.state.services.inference.worker
    prompts = ["What is 2 + 3?", "What is 7 * 6?", "Tell me a joke"]
    first = infer(iclient, prompts=prompts, max_tokens=12, temperature=1.0)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["environment"] == "arithmetic" and body["model"] == "tiny-random"
    assert [r["prompt"] for r in body["results"]] == prompts
    env = ArithmeticEnv()
    for result in body["results"][:2]:
        # The score is the verifier's own judgement of the response the model gave.
        assert result["score"] == env.score(result["prompt"], result["response"])
        assert result["correct"] == (result["score"] == 1.0)
    unscorable = body["results"][2]
    assert unscorable["score"] is None and "cannot score" in unscorable["reason"]
    assert body["summary"]["count"] == 3 and body["summary"]["scored"] == 2
    starts, pid = worker.client.starts, worker.pid
    second = infer(iclient, prompts=["What is 1 + 1?"], max_tokens=8)
    assert second.status_code == 200
    assert worker.client.starts == starts and worker.pid == pid  # served by the warm worker
    assert second.json()["summary"]["latency_s"] < first.json()["summary"]["latency_s"]


def test_items_from_the_environment_and_greedy_is_repeatable(iclient: TestClient) -> None:
    a = infer(iclient, environment="repeat_word", num_items=3, max_tokens=6, temperature=0.0)
    b = infer(iclient, environment="repeat_word", num_items=3, max_tokens=6, temperature=0.0)
    assert a.status_code == 200, a.text
    assert [r["response"] for r in a.json()["results"]] == [
        r["response"] for r in b.json()["results"]
    ]
    for result in a.json()["results"]:
        assert result["prompt"].startswith("Repeat this word: ")
        assert result["score"] == RepeatWordEnv().score(result["prompt"], result["response"])


def test_multi_turn_environment_plays_whole_episodes(iclient: TestClient) -> None:
    resp = infer(iclient, environment="guess_number", num_items=2, max_tokens=8)
    assert resp.status_code == 200, resp.text
    for result in resp.json()["results"]:
        assert result["turns"] and 1 <= len(result["turns"]) <= 4
        assert result["score"] == pytest.approx(sum(t["reward"] for t in result["turns"]))


def test_worker_restarts_after_it_dies(iclient: TestClient) -> None:
    worker = iclient.app.state.services.inference.worker
    assert infer(iclient, prompts=["What is 1 + 2?"], max_tokens=4).status_code == 200
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(lambda: worker.pid is None, 5)
    resp = infer(iclient, prompts=["What is 1 + 2?"], max_tokens=4)
    assert resp.status_code == 200, resp.text
