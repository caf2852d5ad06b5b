"""POST /runs with the algorithm fields (max_steps_off_policy, kl_penalty_coef, kl_reference,
teacher, reward_coef, gspo and stable_reinforce): bad values are 4xx answers naming the field,
before any run exists; a run reference is checked against the database and pinned to its step.
The runner is the fake one (tests/support/fake_runners): nothing trains here. (The run
references' checks against live runs: tests/slow/test_run_algorithms.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from core import lifecycle, loss_config
from core.atropos import AtroposTrainingConfig, locked_env_values
from core.db import make_engine
from core.training_config import TrainingConfig
from server.app import create_app
from tests.support.helpers import end_run_leftovers, processes_with, wait_for
from tests.support.settings import make_settings

FAKE = "tests.support.fake_runners.runner"


@pytest.fixture
def aclient(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("FAKE_RUNNER_STEP_S", "0.01")
    monkeypatch.delenv("FAKE_RUNNER_MODE", raising=False)
    with TestClient(create_app(make_settings(tmp_path, runner_module=FAKE))) as client:
        client.post("/environments/arithmetic/select")
        yield client
    var = tmp_path / "var"
    if (var / "runs").is_dir():
        wait_for(lambda: not processes_with(var / "runs"), 20)
        end_run_leftovers(var)


def finished_run(
    client: TestClient, tmp_path: Path, model: str, samplers: list[int], remote: bool = False
) -> str:
    """A finished (fake) run on `model` with sampler checkpoints at `samplers` steps (saved on
    Tinker if `remote`)."""
    created = client.post("/runs", json={"total_steps": 1, "model_name": model})
    assert created.status_code == 200, created.text
    run_id = created.json()["run_id"]
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["status"] == "succeeded")
    engine = make_engine(client.app.state.settings.db_url)
    for step in samplers:
        name = f"step-{step:06d}"
        folder = tmp_path / "var" / "runs" / run_id / "checkpoints" / name / "sampler"
        path = f"tinker://{run_id}/sampler_weights/{name}" if remote else str(folder)
        lifecycle.record_checkpoint(engine, run_id, step, "sampler", name, path)
    engine.dispose()
    return run_id


def frozen(tmp_path: Path, run_id: str) -> dict:
    return json.loads((tmp_path / "var" / "runs" / run_id / "config.json").read_text())["config"]


def refused(client: TestClient, tmp_path: Path, body: dict, field: str, needle: str = "") -> str:
    """POST /runs answers 422 naming `field` (and saying `needle`), and no run is made."""
    before = {r["run_id"] for r in client.get("/runs").json()}
    answer = client.post("/runs", json=body)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert f"'{field}'" in detail and needle in detail, detail
    assert {r["run_id"] for r in client.get("/runs").json()} == before
    return str(detail)


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ({"loss_fn": "gpso"}, "loss_fn", "'gspo'"),
        ({"max_steps_off_policy": -1}, "max_steps_off_policy", "greater than or equal to 0"),
        ({"max_steps_off_policy": "two"}, "max_steps_off_policy", ""),
        ({"kl_penalty_coef": -0.1}, "kl_penalty_coef", ""),
        ({"kl_reference": "latest"}, "kl_reference", "neither 'base'"),
        ({"kl_reference": "r-00000000", "kl_penalty_coef": 0.1}, "kl_reference", "no run"),
        ({"teacher": "./no/such/model"}, "teacher", "local backend cannot load it"),
        ({"teacher": "r-00000000@step-2"}, "teacher", "no run r-00000000"),
        ({"reward_coef": 0}, "reward_coef", "without a teacher"),
        ({"loss_fn": "gspo", "loss_fn_config": {"beta": 0.1}}, "loss_fn_config", "'beta'"),
        (
            {"loss_fn": "stable_reinforce", "loss_fn_config": {"kl_coeff": -1}},
            "loss_fn_config",
            "kl_coeff",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_field(
    aclient: TestClient, tmp_path: Path, body: dict, field: str, needle: str
) -> None:
    refused(aclient, tmp_path, body, field, needle)
    runs = tmp_path / "var" / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []


def test_the_losses_a_run_may_choose_are_the_declared_rl_ones() -> None:
    # The dashboard's select reads the schema's enum; cross_entropy is no RL loss.
    choices = [name for name, loss in loss_config.LOSSES.items() if loss.rl]
    assert "cross_entropy" not in choices and TrainingConfig().loss_fn == "importance_sampling"
    assert TrainingConfig.model_json_schema()["properties"]["loss_fn"]["enum"] == choices
    with pytest.raises(ValidationError, match="loss_fn\n  Input should be 'importance_sampling'"):
        TrainingConfig(loss_fn="cross_entropy")


def test_a_run_that_samples_ahead_trains_with_stable_reinforce_unless_it_chose(
    aclient: TestClient, tmp_path: Path
) -> None:
    """tinker-cookbook's async runs default to stable_reinforce; so do ours (issue 53)."""

    def loss_of(**body: object) -> str:
        made = aclient.post("/runs", json={"total_steps": 1, **body})
        assert made.status_code == 200, made.text
        return str(frozen(tmp_path, made.json()["run_id"])["loss_fn"])

    assert loss_of(max_steps_off_policy=2) == "stable_reinforce"
    assert loss_of(max_steps_off_policy=2, loss_fn="cispo") == "cispo"
    assert loss_of(max_steps_off_policy=0) == "importance_sampling"
    assert loss_of() == "importance_sampling"


def test_stable_reinforce_is_refused_for_an_atropos_environment() -> None:
    # Its groups carry no sampled sequence's id for the loss to read the sampler's record by.
    with pytest.raises(ValidationError, match="loss_fn\n.*carry no sequence ids"):
        AtroposTrainingConfig(loss_fn="stable_reinforce")
    # Nor is it offered: the schema's choices are the ones its runs can use.
    offered = AtroposTrainingConfig.model_json_schema()["properties"]["loss_fn"]["enum"]
    assert offered == [name for name in loss_config.RL_LOSSES if name != "stable_reinforce"]
    assert AtroposTrainingConfig(loss_fn="gspo", max_steps_off_policy=2).loss_fn == "gspo"
    assert locked_env_values(4, 2, 3)["max_batches_offpolicy"] == 3
    assert locked_env_values(4, 2, None)["max_batches_offpolicy"] == 1
