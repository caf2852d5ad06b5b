"""Continuous batching in the sampling engine: late requests join the running batch, and a
row's tokens and logprobs do not depend on when it arrived or whom it shared a batch with."""

from __future__ import annotations

import threading

import numpy as np
from tinker import types

from runners.engine.local import LocalTrainingClient
from tests.support.helpers import wait_for


def prompt(tokens: list[int]) -> types.ModelInput:
    return types.ModelInput.from_ints(tokens)


def params(seed: int, max_tokens: int) -> types.SamplingParams:
    return types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, stop=[])


def test_a_late_request_starts_before_the_running_batch_ends(trainer: LocalTrainingClient):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokens = trainer.get_tokenizer().encode("a long one")
    long = sampler.sample(prompt(tokens), 1, params(1, 400))
    # Once the long request is decoding, a short one arrives: it joins at the next step and is
    # answered while the long one still decodes (before, it waited for the whole batch).
    wait_for(lambda: sampler.sampling_stats()["batches"] >= 1, 30, every=0.001)
    short = sampler.sample(prompt(tokens[:2]), 1, params(2, 4)).result(timeout=60)
    assert not long.done()
    assert len(short.sequences[0].tokens) == 4
    assert len(long.result(timeout=120).sequences[0].tokens) == 400
    assert sampler.sampling_stats()["batches"] == 2  # two prefills into one running batch


def test_staggered_requests_get_what_they_get_together(trainer: LocalTrainingClient):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokenizer = trainer.get_tokenizer()
    prompts = [tokenizer.encode(text) for text in ("first", "a second prompt", "3")]
    lengths = [60, 30, 45]
    together = [
        f.result(timeout=120)
        for f in [
            sampler.sample(prompt(p), 2, params(10 + i, n))
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
        ]
    ]
    staggered = []
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        before = sampler.sampling_stats()["batches"]
        staggered.append(sampler.sample(prompt(p), 2, params(10 + i, n)))
        # The next one arrives only once this one is decoding: they meet mid-batch.
        wait_for(lambda b=before: sampler.sampling_stats()["batches"] > b, 30, every=0.001)
    for alone, late in zip(together, staggered, strict=True):
        for a, b in zip(alone.sequences, late.result(timeout=120).sequences, strict=True):
            assert a.tokens == b.tokens
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_a_cancelled_request_stops_at_the_next_step_and_others_go_on(
    trainer: LocalTrainingClient,
):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokens = trainer.get_tokenizer().encode("a long one")
    cancel = threading.Event()
    doomed = sampler.sample(prompt(tokens), 2, params(1, 1500), cancel=cancel)
    other = sampler.sample(prompt(tokens), 1, params(2, 300))
    wait_for(lambda: sampler.sampling_stats()["batches"] >= 1, 30, every=0.001)
    cancel.set()
    stopped = doomed.result(timeout=60)
    for sequence in stopped.sequences:
        assert sequence.stop_reason == "length" and 1 <= len(sequence.tokens) < 1500
    assert len(other.result(timeout=120).sequences[0].tokens) == 300  # untouched
