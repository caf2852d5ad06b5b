"""A verifiers environment's config as the user sees it: its own arguments (v0:
load_environment's parameters, read in the verifiers interpreter) beside our training fields;
edits validated by their owner; a run its environment could not start with refused at
POST /runs with the reason, nothing created."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.settings import make_settings
from tests.verifiers.conftest import ENVS, publish

SEEDED = '''import verifiers as vf
from datasets import Dataset


def load_environment(seed: int = 3, rounds: int = 2, tone: str = "plain"):
    """Arguments named like the server's own."""
    rows = [{"question": f"Say {i}", "answer": str(i)} for i in range(rounds)]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[]))
'''
NEEDS_HUB = """import verifiers as vf
from datasets import load_dataset


def load_environment(split: str = "train"):
    dataset = load_dataset("someone/word-problems", split=split)
    return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=[]))
"""
NEEDS_KEY = """import verifiers as vf
from datasets import Dataset


def load_environment(judge: str = "gpt-4.1-mini"):
    vf.ensure_keys(["OPENAI_API_KEY"])
    rows = [{"question": "Hi", "answer": "hi"}]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[]))
"""


@pytest.fixture
def client(tmp_path: Path, verifiers_python: str) -> Iterator[TestClient]:
    extra = tmp_path / "extra"
    publish(extra, "seeded", SEEDED)
    publish(extra, "needs-hub", NEEDS_HUB)
    publish(extra, "needs-key", NEEDS_KEY)
    settings = make_settings(tmp_path, env_dirs=[ENVS, extra], inspect_timeout_s=30.0)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_the_config_is_the_environments_arguments_and_ours(client: TestClient) -> None:
    selected = client.post("/environments/reverse-word/select")
    assert selected.status_code == 200, selected.text
    assert selected.json()["framework"] == "verifiers"
    view = client.get("/config").json()
    editable = view["configurable_fields"]
    assert editable["num_examples"] == 8 and editable["system_prompt"] == "Answer with one word."
    assert {"lora_rank", "group_size", "groups_per_step", "max_tokens", "total_steps"} <= set(
        editable
    )
    assert set(view["locked_fields"]) == {"tokenizer_name"}
    described = view["schema"]["properties"]["num_examples"]
    assert described["type"] == "integer" and described["default"] == 8
    listed = {e["name"]: e for e in client.get("/environments").json()}
    assert listed["reverse-word"]["generation"] == "v0"
    assert listed["reverse-word"]["importable"] is True


def test_edits_are_validated_by_their_owner_and_stored(client: TestClient) -> None:
    client.post("/environments/reverse-word/select")
    cases = [
        ("num_examples", "3", 422, "field 'num_examples': Input should be a valid integer"),
        ("groups_per_step", 0, 422, "field 'groups_per_step'"),
        ("tokenizer_name", "x", 400, "field 'tokenizer_name' is locked"),
        ("num_exampels", 3, 400, "field 'num_exampels' does not exist"),
    ]
    for field, value, status, message in cases:
        answer = client.post("/config", json={"field": field, "value": value})
        assert answer.status_code == status, (field, answer.text)
        assert message in answer.json()["detail"], answer.text
    good = client.put(
        "/environments/reverse-word/config", json={"values": {"num_examples": 3, "group_size": 2}}
    )
    assert good.status_code == 200, good.text
    assert good.json()["configurable_fields"]["num_examples"] == 3
    assert client.get("/config").json()["version"] == 1


def test_an_argument_named_like_ours_is_edited_under_env(client: TestClient) -> None:
    view = client.get("/environments/seeded/config").json()
    editable = view["configurable_fields"]
    assert editable["env.seed"] == 3 and editable["seed"] == 0  # theirs and ours, apart
    changed = client.put("/environments/seeded/config", json={"values": {"env.seed": 7, "seed": 1}})
    assert changed.status_code == 200, changed.text
    assert changed.json()["configurable_fields"]["env.seed"] == 7
    bad = client.put("/environments/seeded/config", json={"values": {"env.seed": "x"}})
    assert bad.status_code == 422 and "field 'env.seed'" in bad.json()["detail"]


def test_a_run_its_environment_cannot_start_with_is_refused(client: TestClient) -> None:
    refused = client.post("/runs", json={"environment": "reverse-word", "num_examples": 0})
    assert refused.status_code == 422
    assert "cannot start with this config" in refused.json()["detail"]
    assert "num_examples must be at least 1" in refused.json()["detail"]
    hub = client.post("/runs", json={"environment": "needs-hub"})
    assert hub.status_code == 422 and "someone/word-problems" in hub.json()["detail"]
    key = client.post("/runs", json={"environment": "needs-key"})
    assert key.status_code == 422
    assert "API key" in key.json()["detail"] and "OPENAI_API_KEY" in key.json()["detail"]
    assert client.get("/runs").json() == []
    # Test inference on its own examples is refused the same way.
    tried = client.post(
        "/test/inference", json={"environment": "needs-hub", "num_items": 1, "model": "tiny-random"}
    )
    assert tried.status_code == 422 and "someone/word-problems" in tried.json()["detail"]


def test_a_verifiers_environment_cannot_join_a_mix(client: TestClient) -> None:
    client.post("/environments/repeat_word/select")
    mixed = client.post("/config", json={"field": "environments", "value": {"reverse-word": {}}})
    assert mixed.status_code == 422
    assert "is a verifiers environment" in mixed.json()["detail"]


def test_a_v1_environment_is_its_taskset_and_env_fields_with_the_roles_locked(
    client: TestClient,
) -> None:
    selected = client.post("/environments/vowel-count/select")
    assert selected.status_code == 200, selected.text
    view = client.get("/config").json()
    assert view["configurable_fields"]["words"] == 4  # its taskset config's own field
    assert view["locked_fields"] == {
        "tokenizer_name": view["locked_fields"]["tokenizer_name"],
        "runtime": "subprocess",
        "harness": "null",
    }
    assert view["schema"]["properties"]["words"]["type"] == "integer"
    locked = client.post("/config", json={"field": "runtime", "value": "prime"})
    assert locked.status_code == 400 and "Prime's remote sandboxes" in locked.json()["detail"]
    bad = client.post("/config", json={"field": "words", "value": "2"})
    assert bad.status_code == 422 and "field 'words'" in bad.json()["detail"]
    empty = client.post("/runs", json={"environment": "vowel-count", "words": 0})
    assert empty.status_code == 422 and "its taskset has no tasks" in empty.json()["detail"]
    duo = client.get("/environments/vowel-duo/config").json()
    assert duo["configurable_fields"]["rounds"] == 1  # its Env config's own field


def test_without_the_verifiers_interpreter_it_says_how_to_make_it(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, env_dirs=[ENVS], verifiers_python=str(tmp_path / "no-python")
    )
    with TestClient(create_app(settings)) as client:
        refused = client.post("/environments/reverse-word/select")
    assert refused.status_code == 409
    assert "make install" in refused.json()["detail"]
