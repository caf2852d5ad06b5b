"""Samplers through the API: a snapshot of the training weights, named sampler weights and the
bare base model; stop strings, seeds and prompt logprobs as the local backend gives them."""

from __future__ import annotations

from pathlib import Path

import pytest
import tinker
from tinker import types

from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import KEY, WAIT_S
from tests.tinker_api.reference import ADAM, datums, local_service

pytestmark = pytest.mark.timeout(180)


def prompt(text: str) -> types.ModelInput:
    return types.ModelInput.from_ints(TOKENIZER.encode(text))


class _Tokenizer:
    """tiny-random's tokenizer, loaded the way a script loads it: from the tokenizer id the
    server's get_info gives (a folder on this machine)."""

    tokenizer = None

    def encode(self, text: str) -> list[int]:
        assert self.tokenizer is not None
        return self.tokenizer.encode(text)

    def decode(self, tokens: list[int]) -> str:
        assert self.tokenizer is not None
        return self.tokenizer.decode(tokens)


TOKENIZER = _Tokenizer()


def test_snapshot_sampling_with_stops_seeds_and_prompt_logprobs(
    service: tinker.ServiceClient, tmp_path: Path
) -> None:
    remote = service.create_lora_training_client("tiny-random", rank=4, seed=3).result(WAIT_S)
    TOKENIZER.tokenizer = remote.get_tokenizer()
    remote.forward_backward(datums("cross_entropy"), "cross_entropy")
    remote.optim_step(ADAM)
    sampler = remote.save_weights_and_get_sampling_client().result(WAIT_S)
    local = local_service(tmp_path)
    try:
        here = local.create_lora_training_client("tiny-random", rank=4, seed=3).result()
        here.forward_backward(datums("cross_entropy"), "cross_entropy")
        here.optim_step(ADAM)
        local_sampler = here.save_weights_and_get_sampling_client().result()

        free = types.SamplingParams(max_tokens=12, temperature=1.0, seed=11, stop=[])
        got = sampler.sample(prompt("hello"), 3, free, include_prompt_logprobs=True).result(WAIT_S)
        want = local_sampler.sample(prompt("hello"), 3, free, include_prompt_logprobs=True)
        want = want.result()
        assert [s.tokens for s in got.sequences] == [s.tokens for s in want.sequences]
        for g, w in zip(got.sequences, want.sequences, strict=True):
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
            assert g.stop_reason == "length"
        assert got.prompt_logprobs[0] is None
        assert got.prompt_logprobs[1:] == pytest.approx(want.prompt_logprobs[1:], abs=1e-5)
        # Each sequence carries the id the server gave it when the request was taken.
        ids = [s.sequence_id for s in got.sequences]
        assert len(set(ids)) == 3 and all(ids)

        again = sampler.sample(prompt("hello"), 3, free).result(WAIT_S)
        assert [s.tokens for s in again.sequences] == [s.tokens for s in got.sequences]
        other = free.model_copy(update={"seed": 12})
        assert sampler.sample(prompt("hello"), 3, other).result(WAIT_S).sequences != got.sequences

        # A stop string ends the sequence on the token that completes it (EOS stops too).
        with_eos = types.SamplingParams(max_tokens=12, temperature=1.0, seed=11)
        reference = sampler.sample(prompt("hello"), 1, with_eos).result(WAIT_S).sequences[0]
        assert len(reference.tokens) > 3, "pick a seed whose sample is longer"
        stop = TOKENIZER.decode(reference.tokens[:3])
        stop_params = with_eos.model_copy(update={"stop": [stop]})
        stopped = sampler.sample(prompt("hello"), 1, stop_params).result(WAIT_S).sequences[0]
        assert stopped.stop_reason == "stop" and len(stopped.tokens) <= 3
        assert stopped.tokens == reference.tokens[: len(stopped.tokens)]
        assert stop in TOKENIZER.decode(stopped.tokens)
        local_stopped = local_sampler.sample(prompt("hello"), 1, stop_params).result()
        assert stopped.tokens == local_stopped.sequences[0].tokens

        logprobs = sampler.compute_logprobs(prompt("hello world")).result(WAIT_S)
        assert logprobs[0] is None and len(logprobs) == len("hello world")
    finally:
        local.close()


def test_named_sampler_weights_and_the_base_model(
    service: tinker.ServiceClient, server: LiveServer
) -> None:
    training = service.create_lora_training_client("tiny-random", rank=4, seed=5).result(WAIT_S)
    TOKENIZER.tokenizer = training.get_tokenizer()
    training.forward_backward(datums("cross_entropy"), "cross_entropy")
    training.optim_step(ADAM)
    path = training.save_weights_for_sampler("after-one-step").result(WAIT_S).path
    assert path == f"tinker://{training.model_id}/sampler_weights/after-one-step"
    snapshot = training.save_weights_and_get_sampling_client().result(WAIT_S)

    saved = service.create_sampling_client(model_path=path).result(WAIT_S)
    assert saved.get_base_model() == "tiny-random"  # read back by GET /samplers/{id}
    greedy = types.SamplingParams(max_tokens=8, temperature=0.0, stop=[])
    from_file = saved.sample(prompt("abc"), 1, greedy).result(WAIT_S).sequences[0]
    from_snapshot = snapshot.sample(prompt("abc"), 1, greedy).result(WAIT_S).sequences[0]
    assert from_file.tokens == from_snapshot.tokens

    base = service.create_sampling_client(base_model="tiny-random").result(WAIT_S)
    assert base.sample(prompt("abc"), 2, greedy).result(WAIT_S).sequences[0].tokens

    # A path that was never saved is refused when the sampler is made.
    with pytest.raises(tinker.BadRequestError, match="no checkpoint at"):
        service.create_sampling_client(model_path=path.replace("after-one-step", "nope")).result(
            WAIT_S
        )
    rest = tinker.RestClient(base_url=server.url, api_key=KEY)
    models = {m.model_name for m in rest.get_server_capabilities().result(WAIT_S).supported_models}
    assert "tiny-random" in models
