"""An Atropos environment's config as the user sees it: its own fields (read by the inspector in
the Atropos interpreter), our training fields, the fields the server decides shown locked;
bad edits refused as for ours; a file that does not import there is a 409 naming it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.atropos.conftest import ENVS
from tests.support.helpers import pid_alive, processes_with, wait_for
from tests.support.settings import make_settings

LOCKED = {
    "tokenizer_name",
    "rollout_server_url",
    "batch_size",
    "max_batches_offpolicy",
    "data_path_to_save_groups",
    "data_dir_to_save_evals",
    "openai",
}


@pytest.fixture
def client(tmp_path: Path, atropos_python: str) -> Iterator[TestClient]:
    extra = tmp_path / "extra"
    extra.mkdir()
    settings = make_settings(tmp_path, env_dirs=[ENVS, extra], inspect_timeout_s=8.0)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_the_config_is_the_environments_fields_and_ours(client: TestClient) -> None:
    selected = client.post("/environments/counting/select")
    assert selected.status_code == 200, selected.text
    assert selected.json()["framework"] == "atropos"
    view = client.get("/config").json()
    editable, locked = view["configurable_fields"], view["locked_fields"]
    # Its own config class's fields, with config_init()'s values...
    assert editable["max_number"] == 4 and editable["reward_style"] == "partial"
    assert editable["group_size"] == 3 and editable["total_steps"] == 10
    # ...beside the training fields, and what tinker-atropos locked, locked.
    assert {"lora_rank", "learning_rate", "loss_fn", "groups_per_step", "model_name"} <= set(
        editable
    )
    assert set(locked) == LOCKED
    assert locked["batch_size"] == editable["group_size"] * editable["groups_per_step"]
    assert locked["openai"][0]["server_type"] == "sglang"
    assert not LOCKED & set(view["schema"]["properties"])
    described = view["schema"]["properties"]["max_number"]
    assert described["description"] == "Count up to at most this" and described["maximum"] == 9
    # The reference client's fields are editable.
    for name in ("group_size", "max_token_length", "total_steps", "steps_per_eval", "use_wandb"):
        assert name in editable


def test_edits_are_validated_by_their_owner_and_stored(client: TestClient) -> None:
    client.post("/environments/counting/select")
    edited = client.post("/config", json={"field": "max_number", "value": 7})
    assert edited.status_code == 200, edited.text
    assert edited.json()["configurable_fields"]["max_number"] == 7
    grown = client.post("/config", json={"field": "groups_per_step", "value": 3}).json()
    assert grown["locked_fields"]["batch_size"] == 3 * 3  # follows what it derives from
    cases = [
        ("max_number", "7", 422, "field 'max_number': Input should be a valid integer"),
        ("max_number", 70, 422, "field 'max_number': Input should be less than or equal to 9"),
        ("reward_style", "loose", 422, "field 'reward_style'"),
        ("lora_rank", 0, 422, "field 'lora_rank'"),
        ("batch_size", 4, 400, "field 'batch_size' is locked: it is groups_per_step x group_size"),
        ("rollout_server_url", "http://x", 400, "is locked"),
        ("no_such_field", 1, 400, "field 'no_such_field' does not exist"),
    ]
    for field, value, status, message in cases:
        answer = client.post("/config", json={"field": field, "value": value})
        assert answer.status_code == status, (field, answer.text)
        assert message in answer.json()["detail"], answer.text
    put = client.put("/environments/counting/config", json={"values": {"batch_size": 4}})
    assert put.status_code == 400 and "locked" in put.json()["detail"]  # as for ours
    assert client.get("/config").json()["configurable_fields"]["max_number"] == 7  # unchanged


def test_a_run_body_is_checked_the_same_way(client: TestClient) -> None:
    refused = client.post("/runs", json={"environment": "counting", "max_number": 70})
    assert refused.status_code == 422 and "max_number" in refused.json()["detail"]
    locked = client.post("/runs", json={"environment": "counting", "openai": []})
    assert locked.status_code == 422 and "locked" in locked.json()["detail"]
    assert client.get("/runs").json() == []


def test_an_atropos_environment_cannot_join_a_mix(client: TestClient) -> None:
    answer = client.put(
        "/environments/arithmetic/config", json={"values": {"environments": {"counting": {}}}}
    )
    assert answer.status_code == 422
    assert "'counting' is an Atropos environment" in answer.json()["detail"]


def test_a_file_that_does_not_import_there_is_a_409_naming_it(
    client: TestClient, tmp_path: Path
) -> None:
    broken = tmp_path / "extra" / "broken_env.py"
    broken.write_text(
        "from atroposlib.envs.base import BaseEnv\n"
        "import a_package_nobody_installed\n"
        "class BrokenEnv(BaseEnv):\n    name = 'broken'\n"
    )
    answer = client.post("/environments/broken/select")
    assert answer.status_code == 409
    detail = answer.json()["detail"]
    assert "ModuleNotFoundError: No module named 'a_package_nobody_installed'" in detail
    assert str(broken) in detail or "broken_env.py" in detail
    listed = {e["name"]: e for e in client.get("/environments").json()}
    assert listed["broken"]["importable"] is False and listed["broken"]["framework"] == "atropos"


def test_a_hanging_import_costs_only_its_own_file(client: TestClient, tmp_path: Path) -> None:
    stuck = tmp_path / "extra" / "stuck_env.py"
    stuck.write_text(
        "import time\nfrom atroposlib.envs.base import BaseEnv\ntime.sleep(3600)\n"
        "class StuckEnv(BaseEnv):\n    name = 'stuck'\n"
    )
    answers: dict[str, int] = {}

    def select_stuck() -> None:
        answers["stuck"] = client.post("/environments/stuck/select").status_code

    waiting = threading.Thread(target=select_stuck)
    waiting.start()
    try:
        started = time.monotonic()
        other = client.get("/environments/counting/config")  # meanwhile: not held up
        assert other.status_code == 200 and time.monotonic() - started < 8
    finally:
        waiting.join(timeout=60)
    assert answers["stuck"] == 409
    # Its inspector was ended at the deadline (gone, or a zombie while it is reaped).
    wait_for(lambda: not [p for p in processes_with("inspect_env.py", stuck) if pid_alive(p)])


def test_without_the_atropos_interpreter_it_says_how_to_make_it(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, env_dirs=[ENVS], atropos_python=str(tmp_path / "no" / "python")
    )
    with TestClient(create_app(settings)) as client:
        answer = client.post("/environments/counting/select")
    assert answer.status_code == 409
    assert "make install" in answer.json()["detail"]
