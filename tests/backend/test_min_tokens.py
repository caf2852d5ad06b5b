"""vLLM's `min_tokens` and `ignore_eos` in the local sampler: stop ids cannot be drawn and
stops do not end a sequence before `min_tokens`; with `ignore_eos` end-of-sequence ids are not
stops. On the packed path and on the transformers one."""

from __future__ import annotations

import pytest
from tinker import types

from runners.engine.local import LocalSamplingClient
from runners.engine.sample import scheduler as engine

PROMPT = types.ModelInput.from_ints([60, 61, 62, 63, 64])


@pytest.fixture(params=["packed", "transformers"])
def sampler(request, trainer, monkeypatch) -> LocalSamplingClient:
    if request.param == "transformers":
        monkeypatch.setattr(engine, "packing_wanted", lambda host: False)
    return trainer.save_weights_and_get_sampling_client().result()


def _greedy(sampler: LocalSamplingClient, max_tokens: int = 8, **extra) -> types.SampledSequence:
    stop = extra.pop("stop", [])
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop)
    return sampler.sample(PROMPT, 1, params, **extra).result(timeout=60).sequences[0]


def test_min_tokens_holds_back_a_stop_id(sampler):
    first = _greedy(sampler).tokens[0]
    assert _greedy(sampler, stop=[first]).tokens == [first]  # it stops at once
    held = _greedy(sampler, stop=[first], min_tokens=4)
    assert first not in held.tokens[:4]  # banned from the first four draws
    assert len(held.tokens) >= 4
    assert held.stop_reason == "length" or held.tokens[-1] == first


def test_min_tokens_holds_back_stop_strings(sampler):
    tokens = _greedy(sampler).tokens
    text = sampler.get_tokenizer().decode(tokens[:1])
    assert len(_greedy(sampler, stop=[text]).tokens) == 1
    held = _greedy(sampler, stop=[text], min_tokens=3)
    assert len(held.tokens) >= 3
    assert held.tokens[:3] == tokens[:3]  # strings are not banned: the draws are the same


def test_ignore_eos_keeps_decoding_past_an_end_of_sequence_id(sampler, monkeypatch):
    first = _greedy(sampler).tokens[0]
    monkeypatch.setattr(sampler, "_eos", {first})  # as if the model's EOS were its favourite
    assert _greedy(sampler, stop=None).tokens == [first]
    kept = _greedy(sampler, stop=None, ignore_eos=True)
    assert kept.tokens[0] == first and len(kept.tokens) == 8 and kept.stop_reason == "length"
    # With min_tokens, EOS is banned instead: never drawn in the first min_tokens.
    held = _greedy(sampler, stop=None, min_tokens=5)
    assert first not in held.tokens[:5] and len(held.tokens) >= 5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"min_tokens": -1}, "min_tokens must be a non-negative integer"),
        ({"min_tokens": 9}, r"min_tokens \(9\) must not exceed max_tokens \(8\)"),
        ({"min_tokens": True}, "min_tokens must be a non-negative integer"),
    ],
)
def test_bad_min_tokens_are_refused(trainer, extra, message):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    with pytest.raises(ValueError, match=message):
        _greedy(sampler, **extra)
