"""Token selection for a whole batch in one pass: temperature, top-k, top-p, per-row seeds.

The randomness is counter-based: row r's noise at its n-th token is a hash of (seed_r, n,
vocabulary index), so a row draws the same tokens whatever batch it shares, with no per-row
generator, no per-row kernel and nothing that stops a CUDA graph from capturing it. Sampling
is Gumbel-max over the filtered logits (the same distribution as a softmax draw). The logprob
reported is under the raw model distribution, as a training forward pass computes it.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finaliser on the low 32 bits of int64 values (wrap-around products)."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from its 64-bit seed and its token counter."""
    low, high = seeds & _MASK32, (seeds >> 32) & _MASK32
    key = _fmix32(low ^ _fmix32(high + 0x9E3779B9))
    return _fmix32(key ^ ((counters * 0x9E3779B1) & _MASK32))


def uniform_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] uniforms in (0, 1), float32, a pure function of each row's key."""
    index = torch.arange(vocab, device=keys.device, dtype=torch.int64)
    bits = _fmix32(keys[:, None] + index[None, :] * 0x27D4EB2F)
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def filter_logits(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-k then top-p per row on temperature-scaled logits (k <= 0 or k >= vocab, and
    p >= 1, leave a row alone); the most likely token always stays."""
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=scaled.device)[None, :]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    drop = ranks >= k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
    drop |= (before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits.masked_fill(drop, -torch.inf))


def select_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    keys: torch.Tensor,
    *,
    filtered: bool = True,
) -> torch.Tensor:
    """Pick one token per row; returns [2, rows] float32: the tokens and their raw logprobs.

    Rows with temperature 0 take the argmax. `filtered=False` skips the top-k/top-p pass
    (a caller that knows no row uses it saves a sort of the vocabulary)."""
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    sampling = temperature > 0
    scaled = logits / torch.where(sampling, temperature, 1.0)[:, None]
    if filtered:
        scaled = filter_logits(scaled, top_k, top_p)
    gumbel = -torch.log(-torch.log(uniform_noise(keys, logits.shape[-1])))
    drawn = (scaled + gumbel).argmax(dim=-1)
    tokens = torch.where(sampling, drawn, logits.argmax(dim=-1))
    picked = raw_logprobs.gather(-1, tokens[:, None])[:, 0]
    return torch.stack([tokens.to(torch.float32), picked])
