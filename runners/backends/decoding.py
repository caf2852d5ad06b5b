"""Batched decoding with a KV cache: left-padded prompts, per-row sampling settings and stops.

The logprob reported for a sampled token is under the raw model distribution (log_softmax of
the logits, before temperature, top-k or top-p), so it matches a training forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# forward(input_ids, attention_mask, position_ids, cache) -> logits of the last position [B, V]
ForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object], torch.Tensor]


@dataclass
class Row:
    """One sequence to sample, with its own settings and random stream."""

    prompt: list[int]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    generator: torch.Generator
    deadline: float | None = None  # time.monotonic() after which the row stops ("length")
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: str | None = None


def _filtered_logits(logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
    """Temperature, then top-k and top-p per row (rows with temperature 0 are left alone)."""
    temps = torch.tensor(
        [r.temperature if r.temperature > 0 else 1.0 for r in rows], device=logits.device
    )
    scaled = logits / temps[:, None]
    vocab = logits.shape[-1]
    ks = [r.top_k if 0 < r.top_k < vocab else vocab for r in rows]
    if all(k == vocab for k in ks) and all(r.top_p >= 1.0 for r in rows):
        return scaled
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    drop = ranks >= torch.tensor(ks, device=logits.device)[:, None]
    top_ps = torch.tensor([r.top_p for r in rows], device=logits.device)[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    before = probs.cumsum(dim=-1) - probs
    drop |= (before >= top_ps) & (top_ps < 1.0)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)


def pick_tokens(logits: torch.Tensor, rows: list[Row]) -> tuple[list[int], list[float]]:
    """Sample one token per row; return the tokens and their raw-model logprobs."""
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    probs = torch.softmax(_filtered_logits(logits, rows), dim=-1)
    greedy = logits.argmax(dim=-1).tolist()
    tokens = []
    for i, row in enumerate(rows):
        if row.temperature <= 0:
            tokens.append(greedy[i])
        else:
            tokens.append(int(torch.multinomial(probs[i], 1, generator=row.generator)))
    picked = raw_logprobs.gather(-1, torch.tensor(tokens, device=logits.device)[:, None])
    return tokens, picked[:, 0].tolist()


def _finished(row: Row, decode: Callable[[list[int]], str], max_positions: int | None) -> bool:
    token = row.tokens[-1]
    if token in row.stop_ids:
        row.stop_reason = "stop"
    elif row.stop_strings and any(s in decode(row.tokens) for s in row.stop_strings):
        row.stop_reason = "stop"
    elif len(row.tokens) >= row.max_tokens:
        row.stop_reason = "length"
    elif max_positions is not None and len(row.prompt) + len(row.tokens) >= max_positions:
        row.stop_reason = "length"
    elif row.deadline is not None and time.monotonic() >= row.deadline:
        row.stop_reason = "length"
    return row.stop_reason is not None


def decode_batch(
    forward: ForwardFn,
    rows: list[Row],
    *,
    pad_id: int,
    device: torch.device,
    decode: Callable[[list[int]], str],
    max_positions: int | None = None,
) -> None:
    """Fill `tokens`, `logprobs` and `stop_reason` of every row, decoding them as one batch."""
    from transformers import DynamicCache

    width = max(len(r.prompt) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, width - len(row.prompt) :] = torch.tensor(row.prompt)
        mask[i, width - len(row.prompt) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    # Left padding: positions count real tokens only, so each row sees the positions it would
    # see alone.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    active = list(range(len(rows)))
    logits = forward(input_ids, mask, positions, cache)
    while True:
        live = [rows[i] for i in active]
        tokens, logprobs = pick_tokens(logits, live)
        keep = []
        for slot, (row, token, logprob) in enumerate(zip(live, tokens, logprobs, strict=True)):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if not _finished(row, decode, max_positions):
                keep.append(slot)
        if not keep:
            return
        next_ids = torch.tensor(tokens, device=device)[:, None]
        positions = positions[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if len(keep) < len(active):
            # Drop finished rows from the batch and the cache so they cost nothing more.
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            next_ids, positions, mask = next_ids[index], positions[index], mask[index]
            active = [active[slot] for slot in keep]
        logits = forward(next_ids, mask, positions, cache)
