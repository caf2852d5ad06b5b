"""verifiers runs on the Tinker backend, v0 and v1: the unmodified SDK against the loopback
stand-in. The face serves the hosted sampler to the environment's driver, and the datums carry
the sampler's logprobs on the model's tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from runners.models.tiny import build_tiny_tokenizer
from server.app import create_app
from tests.support.helpers import finish_run, start_run
from tests.support.settings import make_settings
from tests.support.standins.tinker_standin import (
    TinkerStandin,
    answering_with,
    token_logprob,
)
from tests.verifiers.conftest import ENVS

KEY = "tml-standin-test-key-0123456789"
TOKENIZER = build_tiny_tokenizer()
# Near what reverse-word asks (planet, garden, ... backwards), and vowel-count (how many
# vowels): rewards that differ.
ANSWERS = ["tenalp", "tenlap", "nedrag", "planet", "revlis", "x", "3", "2 vowels", "three"]


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[TinkerStandin]:
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    with TinkerStandin(
        expected_api_key=KEY,
        sample_fn=answering_with(ANSWERS, TOKENIZER),
        extra_models=("tiny-random",),
    ) as server:
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
        run = finish_run(client, run_id, 300)
        logs = client.get(f"/runs/{run_id}/logs", params={"tail": 40}).json()["lines"]
        assert run["status"] == "succeeded", "\n".join(logs)
        assert run["weights_path"].startswith("tinker://")
        assert KEY not in "\n".join(logs)

    samples = standin.bodies("asample")
    assert len(samples) == 2 * 2 * 3  # one request per rollout (verifiers asks one at a time)
    if environment == "vowel-count":  # v1: the prompt rendered by verifiers' renderer
        assert all(b.get("num_samples") == 1 for b in samples)
    data = [d for request in standin.bodies("forward_backward") for d in request["data"]]
    assert data
    for datum in data:
        inputs = datum["loss_fn_inputs"]
        targets = inputs["target_tokens"]["values"]
        logprobs = inputs["logprobs"]["values"]
        trained = [i for i, lp in enumerate(logprobs) if lp != 0.0]
        assert trained  # the answer's tokens, with the sampler's logprobs
        assert [logprobs[i] for i in trained] == pytest.approx(
            [token_logprob(targets[i]) for i in trained], abs=1e-6
        )
