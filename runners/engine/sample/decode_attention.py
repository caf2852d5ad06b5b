"""Attention for the sampling copy: a decode step (one new token per row, a prepared 4-D mask)
with fewer key/value heads than query heads runs as one SDPA call per layer over the cache as
it is, the query heads of each key/value head attending as a group.

transformers' `sdpa` path copies every cached key and value once per query head (`repeat_kv`)
whenever a mask is given; with one fixed slot per row a mask always is, and on an H200 those
copies were a quarter of a 1.5B decode step. Everything else (prefill, no grouping, no 4-D
mask) goes to transformers' own `sdpa` function unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

NAME = "rlcs_grouped_sdpa"


def grouped_decode_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query [rows, heads, 1, dim], key and value [rows, kv_heads, length, dim], mask
    [rows, 1, 1, length]; returns [rows, 1, heads, dim] as transformers' attention functions do."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rows, heads, steps, dim = query.shape
    kv_heads = key.shape[1]
    grouped = attention_mask is not None and attention_mask.dim() == 4
    if steps != 1 or kv_heads == heads or not grouped or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    # Query head h reads key/value head h // groups (repeat_kv's order), so the heads of one
    # group are consecutive: they become that key/value head's queries.
    queries = query.view(rows, kv_heads, heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(
        queries, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(rows, heads, 1, dim).transpose(1, 2), None


def register() -> None:
    """Make NAME a valid attention implementation (its masks are built as sdpa's)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_grouped_decode(model: nn.Module) -> bool:
    """Switch a model (the sampler's own copy: the config object is its own) from `sdpa` to
    grouped decode attention; other implementations are left alone."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    config._attn_implementation = NAME  # type: ignore[union-attr]
    return True
