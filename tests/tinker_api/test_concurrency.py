"""Two scripts training at once on one base model: one model loaded in the engine host, each
client's requests in order, their steps taking turns rather than mixing, each getting the
numbers it would get alone; and one session's end changes nothing of the other."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tinker

from tests.tinker_api.conftest import WAIT_S
from tests.tinker_api.reference import ADAM, datums, local_service

pytestmark = pytest.mark.timeout(180)
STEPS = 3


def train(seed: int) -> tuple[list[float], list[float]]:
    """A script's work in its own session: losses of each step and the final logprobs."""
    service = tinker.ServiceClient()
    try:
        training = service.create_lora_training_client("tiny-random", rank=4, seed=seed).result(
            WAIT_S
        )
        data = datums("ppo", seed)
        futures = []
        for _ in range(STEPS):
            futures.append(training.forward_backward(data, "ppo"))
            training.optim_step(ADAM)
        losses = [f.result(WAIT_S).metrics["loss:sum"] for f in futures]
        final = training.forward(data, "ppo").result(WAIT_S)
        return losses, final.loss_fn_outputs[0]["logprobs"].tolist()
    finally:
        service.close("success").result(WAIT_S)


def alone(seed: int, folder: Path) -> tuple[list[float], list[float]]:
    local = local_service(folder)
    try:
        training = local.create_lora_training_client("tiny-random", rank=4, seed=seed).result()
        data = datums("ppo", seed)
        losses = []
        for _ in range(STEPS):
            losses.append(training.forward_backward(data, "ppo").result().metrics["loss:sum"])
            training.optim_step(ADAM).result()
        final = training.forward(data, "ppo").result()
        return losses, final.loss_fn_outputs[0]["logprobs"].tolist()
    finally:
        local.close()


def test_two_clients_at_once_on_one_base_model(tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(train, [31, 32]))
    for seed, (losses, final) in zip([31, 32], got, strict=True):
        want_losses, want_final = alone(seed, tmp_path / str(seed))
        assert losses == pytest.approx(want_losses, rel=1e-5)
        assert final == pytest.approx(want_final, abs=1e-5)
    assert got[0][0] != pytest.approx(got[1][0])
