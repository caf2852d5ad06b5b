"""Test inference through the API: the warm worker, scoring, adapters and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from environments.arithmetic import ArithmeticEnv
from environments.base import Unscorable
from environments.repeat_word import RepeatWordEnv
from server.app import create_app
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
