"""The slot batch against the dynamic-cache batch on every spec, and late rows joining free
slots: the slow tests of tests/backend/test_slot_batch.py."""

from __future__ import annotations

import numpy as np
import pytest

from runners.engine.sample.dynamic_batch import DynamicCacheBatch
from tests.backend.test_slot_batch import SPECS, _drain, _model, _rows, _slots


def _running(model, trainer) -> DynamicCacheBatch:
    return DynamicCacheBatch(
        model, pad_id=0, device=trainer._host.device, decode=trainer.get_tokenizer().decode
    )


@pytest.mark.parametrize("settings", [{}, {"top_k": 5, "top_p": 0.8}, {"temperature": 0.0}])
def test_slot_batch_matches_the_dynamic_cache_batch(trainer, settings):
    model = _model(trainer)
    want, got = _rows(SPECS, **settings), _rows(SPECS, **settings)
    _drain(_running(model, trainer), want)
    _drain(_slots(model, trainer), got)
    for a, b in zip(want, got, strict=True):
        assert a.tokens == b.tokens and a.stop_reason == b.stop_reason == "length"
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_late_rows_join_free_slots_and_match(trainer):
    model = _model(trainer)
    alone = _rows(SPECS)
    for row in alone:
        _drain(_slots(model, trainer), [row])
    batch = _slots(model, trainer, slots=4)
    first, second, third = _rows(SPECS)
    batch.join([first])
    for _ in range(3):
        batch.step()
    batch.join([second])  # joins mid-way, in the next free slot
    assert batch.rows[1] is second
    batch.step()
    batch.join([third])
    while len(batch):
        batch.step()
    assert batch.prefills == 3
    for a, b in zip(alone, (first, second, third), strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
