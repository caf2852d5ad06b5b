"""The three adapters through the HTTP API: listed, selectable, and config errors as 4xx."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

ADAPTERS = {
    "gem": ("GemEnv", "environments/gem_env.py"),
    "reasoning_gym": ("ReasoningGymEnv", "environments/reasoning_gym_env.py"),
    "openreward": ("OpenRewardEnv", "environments/openreward_env.py"),
}


def test_adapters_are_listed_and_selectable(api: TestClient) -> None:
    listed = {e["name"]: e for e in api.get("/environments").json()}
    for name, (class_name, file_path) in ADAPTERS.items():
        assert listed[name]["class_name"] == class_name
        assert listed[name]["file_path"] == file_path
        assert listed[name]["description"]
        selected = api.post(f"/environments/{name}/select")
        assert selected.status_code == 200, selected.text
        assert selected.json()["selected"] == name
        config = api.get("/config").json()
        assert config["environment"] == name
    listed = {e["name"]: e for e in api.get("/environments").json()}
    assert all(listed[name]["importable"] for name in ADAPTERS)
    gem = api.get("/environments/gem/config").json()["configurable_fields"]
    assert gem["env_id"] == "game:GuessTheNumber-v0-easy" and gem["wrappers"] == "concat"


@pytest.mark.parametrize(
    ("env", "values", "needles"),
    [
        (
            "gem",
            {"env_id": "game:GuessTheNumbr-v0-easy"},
            ["env_id", "game:GuessTheNumber-v0-easy"],
        ),
        ("gem", {"env_id": "qa:HotpotQA"}, ["env_id", "network"]),
        ("gem", {"env_id": "game:Hangman-v0-easy"}, ["env_id", "nltk"]),
        ("gem", {"wrappers": "concat,foo"}, ["wrappers", "unknown GEM wrapper"]),
        ("reasoning_gym", {"dataset": "leg_countin"}, ["dataset", "leg_counting"]),
        ("reasoning_gym", {"dataset_config": {"max_animal": 3}}, ["dataset_config", "max_animals"]),
        (
            "openreward",
            {"env_name": "guessenv", "base_url": "http://10.1.2.3:8000"},
            ["base_url", "loopback"],
        ),
    ],
)
def test_bad_config_is_a_422_naming_the_field(
    api: TestClient, env: str, values: dict, needles: list[str]
) -> None:
    before = api.get(f"/environments/{env}/config").json()
    resp = api.put(f"/environments/{env}/config", json={"values": values})
    assert resp.status_code == 422, resp.text
    for needle in needles:
        assert needle in resp.json()["detail"]
    assert api.get(f"/environments/{env}/config").json() == before  # nothing changed


def test_single_field_edit_and_run_overrides_are_checked(api: TestClient) -> None:
    api.post("/environments/reasoning_gym/select")
    resp = api.post("/config", json={"field": "dataset", "value": "basic_arithmetc"})
    assert resp.status_code == 422 and "basic_arithmetic" in resp.json()["detail"]
    ok = api.post("/config", json={"field": "dataset", "value": "basic_arithmetic"})
    assert ok.status_code == 200 and ok.json()["configurable_fields"]["dataset"] == (
        "basic_arithmetic"
    )
    run = api.post("/runs", json={"environment": "gem", "env_id": "game:Sokobn-v0-easy"})
    assert run.status_code == 422 and "game:Sokoban-v0-easy" in run.json()["detail"]
