"""Grouped decode attention gives what transformers' sdpa (keys and values copied per query
head) gives, and only the sampler's copy uses it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from runners.engine.sample import decode_attention
from runners.engine.sample.sampling_model import SamplingModel


def _inputs(rows: int, heads: int, kv_heads: int, steps: int, length: int, dim: int = 16):
    g = torch.Generator().manual_seed(rows * 100 + heads * 10 + steps)
    query = torch.randn(rows, heads, steps, dim, generator=g)
    key = torch.randn(rows, kv_heads, length, dim, generator=g)
    value = torch.randn(rows, kv_heads, length, dim, generator=g)
    # Each row sees its own prefix of the cache (at least one column), as slot batches do.
    seen = torch.randint(1, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] < seen[:, None]).view(rows, 1, 1, length)
    module = nn.Module()
    module.num_key_value_groups = heads // kv_heads  # what transformers' attention layers hold
    module.is_causal = True
    return module, query, key, value, mask


@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (12, 2), (4, 4)])
def test_grouped_decode_equals_sdpa_with_copied_keys(heads, kv_heads):
    module, query, key, value, mask = _inputs(5, heads, kv_heads, 1, 24)
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, _ = decode_attention.grouped_decode_attention(
        module, query, key, value, mask, scaling=0.25
    )
    assert got.shape == want.shape == (5, 1, heads, 16)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_prefill_goes_to_sdpa_unchanged():
    module, query, key, value, _ = _inputs(2, 4, 2, 6, 6)
    want, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.5)
    got, _ = decode_attention.grouped_decode_attention(module, query, key, value, None, scaling=0.5)
    torch.testing.assert_close(got, want)


def test_only_the_sampling_copy_switches(trainer):
    copy = SamplingModel(trainer._host, torch.float32)
    assert copy.module.config._attn_implementation == decode_attention.NAME
    assert trainer._host.model.config._attn_implementation == "sdpa"
