"""Test inference through the API: the warm worker, scoring, adapters and bad input."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from environments.arithmetic import ArithmeticEnv
from environments.base import Unscorable
from environments.repeat_word import RepeatWordEnv
from server.app import create_app
from tests.support.helpers import wait_for
from tests.support.settings import make_settings


@pytest.fixture(scope="module")
def iclient(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("inference")
    with TestClient(create_app(make_settings(tmp))) as c:
        c.put("/environments/arithmetic/config", json={"values": {"model_name": "tiny-random"}})
        c.put("/environments/repeat_word/config", json={"values": {"model_name": "tiny-random"}})
        c.put("/environments/guess_number/config", json={"values": {"model_name": "tiny-random"}})
        c.post("/environments/arithmetic/select")
        yield c


def infer(client: TestClient, **body):
    return client.post("/test/inference", json=body)


def test_verifiers_on_known_right_and_wrong_answers() -> None:
    env = ArithmeticEnv()
    assert env.score("What is 12 * 3?", "so \\boxed{36}") == 1.0
    assert env.score("What is 12 * 3?", "\\boxed{35}") == 0.0
    assert env.score("What is 12 - 30?", "\\boxed{-18}") == 1.0
    assert env.score("What is 2 + 2?", "4") == 0.0  # no box
    with pytest.raises(Unscorable):
        env.score("hello there", "\\boxed{1}")
    words = RepeatWordEnv()
    assert words.score("Repeat this word: apple", "apple") == 1.0
    assert 0 < words.score("Repeat this word: apple", "appl") < 1
    assert words.score("Repeat this word: apple", "zzz") == 0.0


@pytest.mark.slow
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
    starts, pid = worker.starts, worker.pid
    second = infer(iclient, prompts=["What is 1 + 1?"], max_tokens=8)
    assert second.status_code == 200
    assert worker.starts == starts and worker.pid == pid  # served by the warm worker
    assert second.json()["summary"]["latency_s"] < first.json()["summary"]["latency_s"]


@pytest.mark.slow
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


@pytest.mark.slow
def test_multi_turn_environment_plays_whole_episodes(iclient: TestClient) -> None:
    resp = infer(iclient, environment="guess_number", num_items=2, max_tokens=8)
    assert resp.status_code == 200, resp.text
    for result in resp.json()["results"]:
        assert result["turns"] and 1 <= len(result["turns"]) <= 4
        assert result["score"] == pytest.approx(sum(t["reward"] for t in result["turns"]))


@pytest.mark.slow
def test_worker_restarts_after_it_dies(iclient: TestClient) -> None:
    worker = iclient.app.state.services.inference.worker
    assert infer(iclient, prompts=["What is 1 + 2?"], max_tokens=4).status_code == 200
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(lambda: worker.pid is None, 5)
    resp = infer(iclient, prompts=["What is 1 + 2?"], max_tokens=4)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"prompts": []}, 422, "prompts"),
        ({"prompts": ["x"] * 65}, 422, "prompts"),
        ({"prompts": [1, 2]}, 422, "prompts"),
        ({"prompts": "What is 1 + 1?"}, 422, "prompts"),
        ({"prompts": ["x"], "max_tokens": 0}, 422, "max_tokens"),
        ({"prompts": ["x"], "max_tokens": 10**6}, 422, "max_tokens"),
        ({"prompts": ["x"], "temperature": -1}, 422, "temperature"),
        ({"prompts": ["x"], "temperature": 9}, 422, "temperature"),
        ({"prompts": ["x"], "num_items": 2}, 422, "num_items"),
        ({}, 422, "prompts"),
        ({"prompts": ["x"], "environment": "nope"}, 404, "nope"),
        ({"prompts": ["x"], "model": "no/such-model"}, 404, "model"),
        ({"prompts": ["x"], "run_id": "r-00000000"}, 404, "r-00000000"),
        ({"prompts": ["x"], "run_id": "bad"}, 422, "run_id"),
        ({"prompts": ["x"], "checkpoint_step": 3}, 422, "run_id"),
    ],
)
def test_bad_input_is_a_4xx_naming_it(iclient: TestClient, body, status, needle) -> None:
    resp = infer(iclient, **body)
    assert resp.status_code == status, resp.text
    assert needle in resp.json()["detail"]


def test_the_prompt_cap_is_the_setting(tmp_path: Path) -> None:
    with TestClient(create_app(make_settings(tmp_path, inference_max_prompts=2))) as c:
        body = c.app.openapi()["components"]["schemas"]["InferenceIn"]["properties"]
        assert body["prompts"]["anyOf"][0]["maxItems"] == 2
        assert body["num_items"]["anyOf"][0]["maximum"] == 2
        for request in ({"prompts": ["a", "b", "c"]}, {"num_items": 3}):
            resp = infer(c, **request)
            assert resp.status_code == 422, resp.text
            assert next(iter(request)) in resp.json()["detail"]


@pytest.mark.training
def test_sampling_a_trained_adapter(tmp_path: Path) -> None:
    with TestClient(create_app(make_settings(tmp_path))) as c:
        run = c.post(
            "/runs",
            json={
                "environment": "repeat_word",
                "model_name": "tiny-random",
                "total_steps": 2,
                "save_every": 1,
                "steps_per_eval": 0,
                "use_wandb": False,
                "group_size": 2,
                "batch_size": 1,
                "max_token_length": 4,
                "lora_rank": 4,
            },
        ).json()["run_id"]
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
