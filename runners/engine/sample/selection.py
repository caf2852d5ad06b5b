"""Token selection for a whole batch in one pass: temperature, top-k, top-p, the rows' banned
ids (stop ids until `min_tokens`), per-row seeds; the chosen token and its raw logprob.

The randomness is counter-based: row r's draw for its n-th token is one uniform from a hash of
(seed_r, n), so a row draws the same tokens whatever batch it shares, with no per-row
generator, no per-row kernel and nothing that stops a CUDA graph from capturing it. A row
samples by inverting its cumulative distribution: the softmax of its filtered, temperature-
scaled logits summed in float64, and the first token whose running sum reaches the uniform
(53 bits) times the total. That is the softmax draw itself, in a handful of passes over the
vocabulary (Gumbel-max, before, hashed noise for every vocabulary entry: about 20 int64 passes).
The running sum is taken in two levels (blocks of 256 tokens, then within the chosen block):
a scan over the whole vocabulary cannot be vectorised and cost 1-7 ms per step on a CPU.
The logprob reported is under the raw model distribution, as a training forward pass computes
it; banned ids are removed from the draw only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MASK32 = 0xFFFFFFFF
_TWO_TO_53 = float(2**53)
_BLOCK = 256  # tokens per block of the two-level cumulative sum


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


def row_uniforms(keys: torch.Tensor) -> torch.Tensor:
    """One float64 uniform in (0, 1) per row, 53 bits from two hashes of its key."""
    high = _fmix32(keys ^ 0x68E31DA4)  # 32 bits
    low = _fmix32(keys + 0x1B56C4E9) >> 11  # 21 bits
    return ((high << 21) + low).to(torch.float64).add_(0.5).mul_(1.0 / _TWO_TO_53)


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


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token ids [rows]: for each row the first whose cumulative probability (float64, in
    two levels) reaches its uniform times the row's total; zero-probability ids never come
    out (the searches are clamped to where the mass is)."""
    rows, vocab = probs.shape
    if vocab % _BLOCK:
        probs = F.pad(probs, (0, -vocab % _BLOCK))
    blocks = probs.view(rows, -1, _BLOCK)
    # Block sums in float32 (a float64 sum would first copy the whole tensor to float64).
    sums = blocks.sum(dim=-1).double().cumsum(dim=-1)  # [rows, blocks]
    target = (uniforms * sums[:, -1])[:, None]
    block = torch.searchsorted(sums, target).clamp_(max=sums.shape[1] - 1)  # [rows, 1]
    before = torch.where(block > 0, sums.gather(-1, (block - 1).clamp_(min=0)), 0.0)
    within = blocks.gather(1, block[:, :, None].expand(rows, 1, _BLOCK))[:, 0]
    running = within.cumsum(dim=-1, dtype=torch.float64)  # [rows, _BLOCK]
    # The chosen block holds mass (its running sum rose past `before`); rounding may put the
    # target a hair outside it, so it is held to (0, the block's total].
    rest = (target - before).clamp_(min=torch.finfo(torch.float64).tiny)
    rest = torch.minimum(rest, running[:, -1:])
    return (block * _BLOCK + torch.searchsorted(running, rest))[:, 0]


def select_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    keys: torch.Tensor,
    *,
    filtered: bool = True,
    greedy: bool = True,
    ban: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Pick one token per row; returns [2, rows] float32: the tokens and their raw logprobs.

    Rows with temperature 0 take the argmax. A caller that knows no row filters
    (`filtered=False`: no top-k/top-p pass, which sorts the vocabulary) or none is greedy
    (`greedy=False`: no argmax) saves that work. `ban`: ids [rows, k] and a flag per row
    [rows]; a flagged row cannot draw those ids (a row's list may repeat an id to fill k)."""
    sampling = temperature > 0
    # float32 from here (a bf16 row times a float32 factor), in a tensor of the step's own.
    scaled = logits * torch.where(sampling, temperature, 1.0).reciprocal()[:, None]
    if ban is not None:
        ids, on = ban
        kept = scaled.gather(-1, ids)
        scaled.scatter_(-1, ids, torch.where(on[:, None], -torch.inf, kept))
    if filtered:
        scaled = filter_logits(scaled, top_k, top_p)
    tokens = draw(torch.softmax(scaled, dim=-1), row_uniforms(keys))
    if greedy:
        tokens = torch.where(sampling, tokens, scaled.argmax(dim=-1))
    raw = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    picked = raw.gather(-1, tokens[:, None])[:, 0]
    return torch.stack([tokens.to(torch.float32), picked])
