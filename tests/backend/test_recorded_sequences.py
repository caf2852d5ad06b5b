"""Recorded sequences: the store's lifetime and size bound, and the samplers that record."""

from __future__ import annotations

import numpy as np
import pytest
from tinker import types

from runners.engine.recorded_sequences import (
    DEFAULT_TTL_S,
    RecordedSequence,
    SequenceStore,
    UnknownSequence,
)

DAY = 24 * 3600.0


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sequence(n: int = 4) -> RecordedSequence:
    return RecordedSequence(
        np.arange(3, dtype=np.int32),
        np.arange(n, dtype=np.int32),
        np.full(n, -0.5, dtype=np.float32),
    )


def test_a_sequence_expires_a_day_after_its_last_use():
    assert DEFAULT_TTL_S == DAY
    clock = Clock()
    store = SequenceStore(clock=clock)
    store.record("a", sequence())
    store.record("b", sequence())
    clock.now += DAY - 60
    store.get("a")  # a use: a lives a day from now
    clock.now += 120  # b was last used a day and a minute ago
    assert store.get("a").tokens.tolist() == [0, 1, 2, 3]
    with pytest.raises(UnknownSequence, match=r"sequence 'b' is not recorded.*24 h"):
        store.get("b")
    clock.now += DAY
    with pytest.raises(UnknownSequence, match="'a'"):
        store.get("a")
    assert len(store) == 0 and store.nbytes == 0


def test_the_store_evicts_the_least_recently_used_past_its_size():
    one = sequence().nbytes
    store = SequenceStore(max_bytes=3 * one, clock=Clock())
    for name in "abc":
        store.record(name, sequence())
    store.get("a")  # b is now the least recently used
    store.record("d", sequence())
    assert len(store) == 3 and store.nbytes == 3 * one
    with pytest.raises(UnknownSequence, match="'b'.*evicted"):
        store.get("b")
    for name in "acd":
        store.get(name)
    # Recording an id again replaces its entry (and its size) rather than adding one...
    store.record("a", sequence())
    assert len(store) == 3 and store.nbytes == 3 * one
    # ...and a larger one makes room by evicting the least recently used (c, then d).
    store.record("a", sequence(14))
    assert store.nbytes == sequence(14).nbytes <= 3 * one
    assert len(store) == 1 and store.get("a").tokens.size == 14


def test_a_store_needs_a_positive_lifetime_and_size():
    with pytest.raises(ValueError, match="positive"):
        SequenceStore(ttl_s=0)
    with pytest.raises(ValueError, match="positive"):
        SequenceStore(max_bytes=0)


def test_every_sample_has_an_id_and_recording_samplers_keep_theirs(service, trainer):
    tokens = trainer.get_tokenizer().encode("Say A:")
    prompt = types.ModelInput.from_ints(tokens)
    params = types.SamplingParams(max_tokens=5, seed=3, stop=[])

    plain = trainer.save_weights_and_get_sampling_client().result()
    ids = [s.sequence_id for s in plain.sample(prompt, 3, params).result().sequences]
    assert all(ids) and len(set(ids)) == 3
    assert len(service.sequences) == 0  # ids always, records only when asked

    recording = trainer.save_weights_and_get_sampling_client(record_stability_info=True).result()
    assert recording.record_stability_info and not plain.record_stability_info
    response = recording.sample(prompt, 3, params).result()
    for sampled in response.sequences:
        kept = service.sequences.get(sampled.sequence_id)
        assert kept.prompt.tolist() == tokens
        assert kept.tokens.tolist() == sampled.tokens
        assert kept.logprobs.tolist() == pytest.approx(sampled.logprobs)
    assert len(service.sequences) == 3

    # Ids fixed by the caller at submission (the Tinker API's) are the ones given and kept.
    given = recording.sample(prompt, 2, params, sequence_ids=["r7:0", "r7:1"]).result()
    assert [s.sequence_id for s in given.sequences] == ["r7:0", "r7:1"]
    assert service.sequences.get("r7:1").tokens.tolist() == given.sequences[1].tokens
    with pytest.raises(ValueError, match="give 2 distinct ids"):
        recording.sample(prompt, 2, params, sequence_ids=["x", "x"])

    base = service.create_sampling_client(
        base_model="tiny-random", record_stability_info=True
    ).result()
    from_base = base.sample(prompt, 1, params).result().sequences[0]
    assert service.sequences.get(from_base.sequence_id).tokens.tolist() == from_base.tokens
    base.close()
