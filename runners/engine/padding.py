"""Prompts of different lengths as one tensor of token ids and its attention mask, padded on
the left (decoding from the same last column) or on the right (positions from 0 in every row):
the sampler's batches and the trainer's forward passes both pad so."""

from __future__ import annotations

import torch


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask [rows, longest prompt], prompts aligned to the right."""
    return _pad(prompts, pad_id, left=True)


def right_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask [rows, longest prompt], prompts aligned to the left."""
    return _pad(prompts, pad_id, left=False)


def _pad(prompts: list[list[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        span = slice(width - len(prompt), width) if left else slice(0, len(prompt))
        ids[i, span] = torch.tensor(prompt)
        mask[i, span] = 1
    return ids, mask
