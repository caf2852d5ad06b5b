"""Atropos runs on the Tinker backend: the unmodified SDK against the loopback stand-in. The
face serves the hosted sampler (a whole group in one sample request), and the datums carry
the sampler's logprobs: sent by the environment (managed_server), or recomputed through the
SDK's compute_logprobs (an environment that samples through /v1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.atropos.conftest import ENVS
from tests.support.framework_on_tinker import (
    KEY,
    answering_standin,
    assert_succeeds_on_tinker,
    trained_data,
)
from tests.support.helpers import start_run
from tests.support.settings import make_settings
from tests.support.standins.tinker_standin import TinkerStandin

# Close to what word_echo (repeat a word) and chat_dialogue (a colour, then in capitals) ask.
ANSWERS = ["apple", "appel", "maple", "river", "red", "RED", "Red", "RXD"]


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[TinkerStandin]:
    with answering_standin(monkeypatch, ANSWERS) as server:
        yield server


def test_atropos_runs_train_on_tinker(
    tmp_path: Path, standin: TinkerStandin, atropos_python: str
) -> None:
    settings = make_settings(
        tmp_path,
        tinker_api_key=KEY,
        tinker_base_url=standin.url,
        env_dirs=[ENVS],
        atropos_stall_s=60.0,
    )
    body = {"model_name": "tiny-random", "total_steps": 2, "use_wandb": False, "save_every": 0}
    with TestClient(create_app(settings)) as client:
        runs = [
            start_run(client, environment="word_echo", groups_per_step=2, **body),
            start_run(client, environment="chat_dialogue", groups_per_step=1, **body),
        ]
        for run_id in runs:
            assert_succeeds_on_tinker(client, run_id)

    # word_echo asks for its whole group in one request (managed_server's n).
    assert 4 in {b.get("num_samples") for b in standin.bodies("asample")}
    # chat_dialogue's sampler logprobs were recomputed through the SDK (prompt logprobs).
    assert any(b.get("prompt_logprobs") for b in standin.bodies("asample"))
    for datum in trained_data(standin):
        inputs = datum["loss_fn_inputs"]
        targets = inputs["target_tokens"]["values"]
        advantages = inputs["advantages"]["values"]
        logprobs = inputs["logprobs"]["values"]
        assert len(datum["model_input"]) == len(targets) == len(logprobs) == len(advantages)
