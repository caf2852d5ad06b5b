"""Tinker SDK sessions on a machine with two engine hosts (RLCS_ENGINE_HOSTS=2): each session is
placed by its base model at its first model and sends every operation there (its training
client, its snapshots, its samples), so two sessions on two bases land on two hosts, each base
loaded once; a host's death ends only the sessions on it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import tinker
from tinker import types

from tests.support.helpers import wait_for
from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import WAIT_S, tinker_server
from tests.tinker_api.reference import ADAM, datums

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with tinker_server(tmp_path_factory.mktemp("tinker-two-hosts"), RLCS_ENGINE_HOSTS="2") as live:
        yield live


@pytest.fixture(scope="module")
def other_base(tmp_path_factory: pytest.TempPathFactory) -> str:
    from runners.models.tiny import build_tiny

    folder = tmp_path_factory.mktemp("bases") / "tiny-copy"
    model, tokenizer = build_tiny()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def served(server: LiveServer) -> dict[str, dict]:
    """Each running host's bases and what the server's connection holds there, by host name."""
    hosts = server.api.get("/engine").json()["hosts"]
    return {
        h["name"]: {
            "bases": sorted(b["name"] for b in h["bases"]),
            "server": [(c["models"], c["samplers"]) for c in h["clients"] if c["role"] == "server"],
            "pid": h["pid"],
        }
        for h in hosts
        if h["running"]
    }


def one_step(training: tinker.TrainingClient) -> None:
    training.forward_backward(datums("cross_entropy"), "cross_entropy").result(WAIT_S)
    training.optim_step(ADAM).result(WAIT_S)
    sampler = training.save_weights_and_get_sampling_client().result(WAIT_S)
    params = types.SamplingParams(max_tokens=3, seed=1)
    prompt = types.ModelInput.from_ints([1, 2, 3])
    assert sampler.sample(prompt, 2, params).result(WAIT_S).sequences


def test_sessions_are_placed_by_base_and_stay_on_their_host(
    two_hosts: LiveServer, other_base: str
) -> None:
    url = two_hosts.url
    x = tinker.ServiceClient(base_url=url, api_key="tml-local-tests")
    y = tinker.ServiceClient(base_url=url, api_key="tml-local-tests")
    on_x = x.create_lora_training_client("tiny-random", rank=4, seed=1).result(WAIT_S)
    on_y = y.create_lora_training_client(other_base, rank=4, seed=1).result(WAIT_S)
    for _ in range(2):
        one_step(on_x)
        one_step(on_y)

    hosts = served(two_hosts)
    assert sorted(h["bases"] for h in hosts.values()) == [[other_base], ["tiny-random"]]
    # Each session's training client and snapshots on its base's host, none on the other.
    for host in hosts.values():
        ((models, samplers),) = host["server"]
        assert models == 1 and samplers >= 1

    (y_host,) = [h for h in hosts.values() if h["bases"] == [other_base]]
    os.kill(y_host["pid"], signal.SIGKILL)
    wait_for(lambda: len(served(two_hosts)) == 1, 30)
    with pytest.raises(tinker.BadRequestError, match="engine host exited"):
        on_y.optim_step(ADAM).result(WAIT_S)
    one_step(on_x)  # the other host's session goes on
    x.close("success").result(WAIT_S)
