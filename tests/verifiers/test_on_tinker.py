"""verifiers runs on the Tinker backend, v0 and v1: the unmodified SDK against the loopback
stand-in. The face serves the hosted sampler to the environment's driver, and the datums carry
the sampler's logprobs on the model's tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.framework_on_tinker import (
    KEY,
    answering_standin,
    assert_succeeds_on_tinker,
    trained_data,
)
from tests.support.helpers import start_run
from tests.support.settings import make_settings
from tests.support.standins.tinker_standin import TinkerStandin
from tests.verifiers.conftest import ENVS

# Near what reverse-word asks (planet, garden, ... backwards), and vowel-count (how many
# vowels): rewards that differ.
ANSWERS = ["tenalp", "tenlap", "nedrag", "planet", "revlis", "x", "3", "2 vowels", "three"]


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[TinkerStandin]:
    with answering_standin(monkeypatch, ANSWERS) as server:
        yield server


@pytest.mark.parametrize("environment", ["reverse-word", "vowel-count"])  # v0, v1
def test_a_verifiers_run_trains_on_tinker(
    tmp_path: Path, standin: TinkerStandin, verifiers_python: str, environment: str
) -> None:
    settings = make_settings(
        tmp_path, tinker_api_key=KEY, tinker_base_url=standin.url, env_dirs=[ENVS]
    )
    with TestClient(create_app(settings)) as client:
        run_id = start_run(
            client,
            environment=environment,
            model_name="tiny-random",
            total_steps=2,
            group_size=3,
            groups_per_step=2,
            use_wandb=False,
            save_every=0,
        )
        assert_succeeds_on_tinker(client, run_id)

    samples = standin.bodies("asample")
    assert len(samples) == 2 * 2 * 3  # one request per rollout (verifiers asks one at a time)
    if environment == "vowel-count":  # v1: the prompt rendered by verifiers' renderer
        assert all(b.get("num_samples") == 1 for b in samples)
    trained_data(standin)
