"""The slot batch (static per-row cache, the step CUDA graphs capture; run eagerly on the CPU):
the same tokens and logprobs as the dynamic-cache batch, late joins, buckets, cache reuse."""

from __future__ import annotations

import numpy as np
import torch

from runners.engine.sample import scheduler
from runners.engine.sample.batch import Row
from runners.engine.sample.sampling_model import SamplingModel
from runners.engine.sample.slot_batch import SlotBatch
from tests.backend.test_continuous_batching import params, prompt


def _rows(specs: list[tuple[list[int], int, int]], **settings) -> list[Row]:
    base = dict(temperature=1.0, top_k=0, top_p=1.0, stop_ids=frozenset(), stop_strings=())
    base.update(settings)
    return [Row(prompt=p, max_tokens=n, seed=seed, **base) for p, n, seed in specs]


def _model(trainer) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer._host.params.values():
            p.add_(torch.randn(p.shape, generator=generator).to(p.device) * 0.05)
    copy = SamplingModel(trainer._host, torch.float32)
    copy.load(0, trainer._host.snapshot())
    return copy.module


def _drain(batch, rows: list[Row]) -> None:
    batch.join(rows)
    while len(batch):
        batch.step()


def _slots(model, trainer, slots: int = 8) -> SlotBatch:
    return SlotBatch(
        model,
        slots=slots,
        pad_id=0,
        device=trainer._host.device,
        decode=trainer.get_tokenizer().decode,
        max_positions=None,
        graphs=True,  # on the CPU the captured step runs eagerly
    )


SPECS = [([5, 9, 2, 7, 1], 12, 3), ([4, 8], 20, 4), ([3, 3, 6], 7, 5)]


def test_cache_room_decides_who_may_join(trainer):
    model = _model(trainer)
    batch = _slots(model, trainer, slots=2)
    batch.join(_rows([([1, 2, 3], 50, 0)]))
    assert batch.can_take(_rows([([1], 10, 1)]))
    assert not batch.can_take(_rows([([1], 10, 1), ([2], 10, 2)]))  # one slot free
    assert not batch.can_take(_rows([([1], 1000, 1)]))  # longer than the cache
    while len(batch):
        batch.step()
    assert batch.can_take(_rows([([1], 1000, 1), ([2], 10, 2)]))  # empty: the cache resizes


def test_engine_with_slot_batches_samples_as_before(trainer, monkeypatch):
    """The engine on slot batches (forced on for the CPU) answers as on dynamic ones."""
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokens = trainer.get_tokenizer().encode("slots")
    want = sampler.sample(prompt(tokens), 3, params(7, 16)).result(timeout=60)
    trainer._host.close()  # a fresh scheduler, built the other way
    monkeypatch.setattr(scheduler, "slots_wanted", lambda device: True)
    got = sampler.sample(prompt(tokens), 3, params(7, 16)).result(timeout=60)
    assert isinstance(scheduler.scheduler_for(trainer._host)._batch, SlotBatch)
    for a, b in zip(want.sequences, got.sequences, strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_a_request_larger_than_the_slots_grows_the_batch(trainer):
    model = _model(trainer)
    batch = _slots(model, trainer, slots=2)
    rows = _rows([([1, 2], 5, i) for i in range(5)])
    _drain(batch, rows)
    assert batch.slots == 5
    assert all(len(r.tokens) == 5 and r.stop_reason == "length" for r in rows)
