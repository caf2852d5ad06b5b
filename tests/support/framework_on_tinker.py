"""What the atropos and verifiers runs on the Tinker backend share: the loopback stand-in
answering with words close to what the environments ask, a run that succeeds on it, and the
datums it was sent carrying the sampler's logprobs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from runners.models.tiny import build_tiny_tokenizer
from tests.support.helpers import finish_run
from tests.support.standins.tinker_standin import TinkerStandin, answering_with, token_logprob

KEY = "tml-standin-test-key-0123456789"
TOKENIZER = build_tiny_tokenizer()


@contextmanager
def answering_standin(
    monkeypatch: pytest.MonkeyPatch, answers: list[str]
) -> Iterator[TinkerStandin]:
    """The stand-in (it expects KEY, serves tiny-random), its samples drawn from `answers`."""
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    with TinkerStandin(
        expected_api_key=KEY,
        sample_fn=answering_with(answers, TOKENIZER),
        extra_models=("tiny-random",),
    ) as server:
        yield server


def assert_succeeds_on_tinker(client: httpx.Client, run_id: str) -> None:
    """The run succeeds with Tinker weights, and its logs never show the key."""
    run = finish_run(client, run_id, 300)
    logs = client.get(f"/runs/{run_id}/logs", params={"tail": 40}).json()["lines"]
    assert run["status"] == "succeeded", "\n".join(logs)
    assert run["weights_path"].startswith("tinker://")
    assert KEY not in "\n".join(logs)


def trained_data(standin: TinkerStandin) -> list[dict[str, Any]]:
    """The datums sent to forward_backward: some, each training on the answer's tokens with
    the sampler's logprobs."""
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
    return data
