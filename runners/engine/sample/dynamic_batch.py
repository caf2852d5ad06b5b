"""The dynamic-cache batch: rows join a running batch (their prefill done alongside) and leave
the step they finish; the KV cache grows and shrinks with them; token selection is one batched
pass per step.

Rows are left-padded: positions count real tokens only, so each row sees the positions it
would see alone, whatever it shares the batch with. The logprob reported for a sampled token
is under the raw model distribution (before temperature, top-k, top-p), as training sees it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from runners.engine.lora import LanguageModel
from runners.engine.padding import left_pad
from runners.engine.sample.batch import Passes, Row, ban_lists, finished, record
from runners.engine.sample.sampling_model import next_token_logits
from runners.engine.sample.selection import row_keys, select_tokens


class DynamicCacheBatch:
    """The rows decoding now, their KV cache, attention mask, positions and next logits."""

    def __init__(
        self,
        model: LanguageModel,
        *,
        pad_id: int,
        device: torch.device,
        decode: Callable[[list[int]], str],
        max_positions: int | None = None,
    ) -> None:
        self._model = model
        self._pad_id = pad_id
        self._device = device
        self._decode = decode
        self._max_positions = max_positions
        self.rows: list[Row] = []
        self._cache: object = None
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=device)
        self._positions = torch.zeros((0, 1), dtype=torch.long, device=device)
        self._logits: torch.Tensor | None = None
        self.prefills = 0

    def __len__(self) -> int:
        return len(self.rows)

    def can_take(self, rows: list[Row]) -> bool:
        return True  # the cache grows with the rows

    def join(self, rows: list[Row]) -> list[Row]:
        """Prefill `rows` as one left-padded batch and merge them into the running one
        (their first tokens come at the next step, so none finishes here)."""
        from transformers import DynamicCache

        ids, mask = left_pad([r.prompt for r in rows], self._pad_id)
        ids, mask = ids.to(self._device), mask.to(self._device)
        width = ids.shape[1]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self._forward(ids, mask, positions, cache)
        self.prefills += 1
        if not self.rows:
            self.rows, self._cache, self._mask = list(rows), cache, mask
            self._positions, self._logits = positions[:, -1:], logits
            return []
        assert self._logits is not None
        length = max(self._mask.shape[1], width)
        _merge_caches(self._cache, cache, length)
        self._mask = torch.cat([_pad_left(self._mask, length), _pad_left(mask, length)])
        self._positions = torch.cat([self._positions, positions[:, -1:]])
        self._logits = torch.cat([self._logits, logits])
        self.rows += rows
        return []

    def step(self) -> list[Row]:
        """Pick a token for every row; rows that finish leave. Returns the finished rows."""
        assert self._logits is not None
        rows = self.rows
        picked = self._pick(self._logits, rows)
        tokens_f, logprobs = picked.tolist()  # the step's one transfer to the host
        tokens = [int(t) for t in tokens_f]
        keep: list[int] = []
        done: list[int] = []
        for slot, (row, token, logprob) in enumerate(zip(rows, tokens, logprobs, strict=True)):
            record(row, token, logprob)
            (done if finished(row, self._decode, self._max_positions) else keep).append(slot)
        if not keep:
            self._reset()
            return [rows[s] for s in done]
        next_ids = torch.tensor([tokens[s] for s in keep], device=self._device)[:, None]
        if done:
            # Finished rows leave the batch and the cache at once, so they cost nothing more.
            index = torch.tensor(keep, device=self._device)
            self._cache.batch_select_indices(index)  # type: ignore[attr-defined]
            self._mask, self._positions = self._mask[index], self._positions[index]
            self.rows = [rows[s] for s in keep]
            self._trim()
        self._positions = self._positions + 1
        self._mask = torch.cat([self._mask, torch.ones_like(self._mask[:, :1])], dim=1)
        self._logits = self._forward(next_ids, self._mask, self._positions, self._cache)
        return [rows[s] for s in done]

    def _pick(self, logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
        """Each row's next token and its logprob ([2, rows]) under the row's own settings."""
        passes = Passes.of(rows)
        ban = None
        if passes.banning:
            ban = (
                self._tensor(ban_lists(rows), torch.long),
                self._tensor(
                    [r.banning and len(r.tokens) < r.min_tokens for r in rows], torch.bool
                ),
            )
        return select_tokens(
            logits,
            self._tensor([r.temperature for r in rows], torch.float32),
            self._tensor([r.top_k for r in rows], torch.long),
            self._tensor([r.top_p for r in rows], torch.float32),
            row_keys(
                self._tensor([r.seed for r in rows], torch.long),
                self._tensor([len(r.tokens) for r in rows], torch.long),
            ),
            filtered=passes.filtered,
            greedy=passes.greedy,
            ban=ban,
        )

    def _forward(self, ids, mask, positions, cache) -> torch.Tensor:
        with torch.no_grad():
            return next_token_logits(self._model, ids, mask, positions, cache)

    def _tensor(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self._device)

    def _trim(self) -> None:
        """Drop leading cache columns no remaining row attends to (padding of rows now gone)."""
        used = self._mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0:
            self._mask = self._mask[:, first:]
            for layer in self._cache.layers:  # type: ignore[attr-defined]
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]

    def _reset(self) -> None:
        self.rows, self._cache, self._logits = [], None, None
        self._mask = self._mask[:0, :0]
        self._positions = self._positions[:0]


def _pad_left(tensor: torch.Tensor, length: int, dim: int = 1) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _merge_caches(into: object, other: object, length: int) -> None:
    """Append `other`'s rows to `into`, both left-padded to `length` positions."""
    for mine, theirs in zip(into.layers, other.layers, strict=True):  # type: ignore[attr-defined]
        mine.keys = torch.cat([_pad_left(mine.keys, length, 2), _pad_left(theirs.keys, length, 2)])
        mine.values = torch.cat(
            [_pad_left(mine.values, length, 2), _pad_left(theirs.values, length, 2)]
        )
