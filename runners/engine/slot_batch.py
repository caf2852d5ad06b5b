"""Continuous batching over a static KV cache with one slot per row, decode steps replayed as
CUDA graphs (one per batch-size bucket).

Each row writes its keys and values at the column equal to its position, so rows of any
length share the cache without padding and a row joins by copying its prefill into a free
slot. The step (forward, token selection, bookkeeping) reads and writes only fixed tensors,
so it is captured once per bucket and replayed; adapters change by `copy_` into the sampling
model's buffers, which the graphs read in place. Without CUDA the same step runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from runners.engine import decode_attention
from runners.engine.batch import Row, finished, record
from runners.engine.dynamic_batch import right_pad
from runners.engine.lora import LanguageModel
from runners.engine.sampling_model import next_token_logits, plain_head
from runners.engine.selection import row_keys, select_tokens

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_LENGTH_STEP = 256  # cache lengths are multiples of this (fewer distinct graphs)


class SlotCache:
    """Keys and values [slots, heads, length, head_dim] per layer; row r writes at column
    `positions[r]` (clamped, so a free slot's stale position stays in bounds)."""

    def __init__(self, positions: torch.Tensor, length: int) -> None:
        self.positions = positions  # [slots, 1], shared with the batch's step inputs
        self.length = length
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.rows = positions.shape[0]  # rows the model sees (a bucket's leading slots)

    def allocate(self, like: object) -> None:
        """Size the buffers after a prefill cache (layers, heads, head_dim, dtype)."""
        slots = self.positions.shape[0]
        for layer in like.layers:  # type: ignore[attr-defined]
            k, v = layer.keys, layer.values
            self.keys.append(k.new_zeros(slots, k.shape[1], self.length, k.shape[3]))
            self.values.append(v.new_zeros(slots, v.shape[1], self.length, v.shape[3]))

    def bucket(self, rows: int) -> SlotCache:
        """A view over the first `rows` slots (same buffers)."""
        view = SlotCache.__new__(SlotCache)
        view.positions, view.length = self.positions, self.length
        view.keys, view.values, view.rows = self.keys, self.values, rows
        return view

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        n = self.rows
        keys, values = self.keys[layer_idx][:n], self.values[layer_idx][:n]
        column = self.positions[:n].clamp(max=self.length - 1).view(n, 1, 1, 1)
        keys.scatter_(2, column.expand_as(key), key)
        values.scatter_(2, column.expand_as(value), value)
        return keys, values

    def place(self, slots: torch.Tensor, prefill: object, width: int) -> None:
        """Copy a prefill cache's rows (columns 0..width-1) into `slots`."""
        for mine_k, mine_v, layer in zip(
            self.keys,
            self.values,
            prefill.layers,  # type: ignore[attr-defined]
            strict=True,
        ):
            mine_k[:, :, :width].index_copy_(0, slots, layer.keys[:, :, :width])
            mine_v[:, :, :width].index_copy_(0, slots, layer.values[:, :, :width])


def supports(model: LanguageModel) -> bool:
    """Full attention in every layer and a plain unembedding (what the slot step assumes)."""
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (
        all(t == "full_attention" for t in layer_types)
        and plain_head(config)
        and getattr(config, "_attn_implementation", "sdpa")
        in ("sdpa", "eager", decode_attention.NAME)
    )


class SlotBatch:
    """The rows decoding now in fixed slots, and the captured step for each bucket."""

    def __init__(
        self,
        model: LanguageModel,
        *,
        slots: int,
        pad_id: int,
        device: torch.device,
        decode: Callable[[list[int]], str],
        max_positions: int | None,
        graphs: bool,
    ) -> None:
        self._model = model
        self._pad_id = pad_id
        self._device = device
        self._decode = decode
        self._max_positions = max_positions
        self._graphs = graphs and device.type == "cuda"
        self.prefills = 0
        self.captures = 0
        self._pool: torch.cuda._POOL_HANDLE | None = None  # the captured graphs' shared memory
        self._cache: SlotCache | None = None
        self._captured: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._allocate_slots(slots)

    def __len__(self) -> int:
        return sum(row is not None for row in self.rows)

    def _allocate_slots(self, slots: int) -> None:
        """The per-slot step inputs and outputs (fixed tensors the graphs read and write)."""
        device = self._device
        self.slots = slots
        self._buckets = sorted({b for b in BUCKETS if b < slots} | {slots})
        self.rows: list[Row | None] = [None] * slots
        new = torch.zeros
        self._tok = new((slots, 1), dtype=torch.long, device=device)
        self._pos = new((slots, 1), dtype=torch.long, device=device)
        self._seed = new(slots, dtype=torch.long, device=device)
        self._count = new(slots, dtype=torch.long, device=device)
        self._temp = new(slots, dtype=torch.float32, device=device)
        self._top_k = new(slots, dtype=torch.long, device=device)
        self._top_p = torch.ones(slots, dtype=torch.float32, device=device)
        self._out = new((2, slots), dtype=torch.float32, device=device)
        self._cache = None  # sized at the next join; graphs read the old tensors, so go too
        self._captured.clear()

    # ----- joining ------------------------------------------------------------------------

    def can_take(self, rows: list[Row]) -> bool:
        """Free slots for all of `rows`, and room in the cache for each row's whole length."""
        if sum(row is None for row in self.rows) < len(rows):
            return False
        if not len(self) or self._cache is None:
            return True
        return all(self._needed(row) <= self._cache.length for row in rows)

    def join(self, rows: list[Row]) -> list[Row]:
        """Prefill `rows` into free slots and pick their first tokens; returns those that
        already finished (their slots are free again)."""
        if not len(self):
            if len(rows) > self.slots:
                # One request with more samples than slots: the batch grows to hold it.
                self._allocate_slots(len(rows))
            self._size_cache(max(self._needed(row) for row in rows))
        assert self._cache is not None
        free = [s for s, row in enumerate(self.rows) if row is None][: len(rows)]
        slots = torch.tensor(free, device=self._device)
        logits, prefill, width = self._prefill(rows)
        if not self._cache.keys:
            self._cache.allocate(prefill)
        self._cache.place(slots, prefill, width)
        lengths = torch.tensor([len(r.prompt) for r in rows], device=self._device)
        self._seed[slots] = torch.tensor([r.seed for r in rows], device=self._device)
        self._count[slots] = 0
        self._temp[slots] = torch.tensor([r.temperature for r in rows], device=self._device)
        self._top_k[slots] = torch.tensor([r.top_k for r in rows], device=self._device)
        self._top_p[slots] = torch.tensor([r.top_p for r in rows], device=self._device)
        self._pos[slots] = lengths[:, None]
        picked = self._select(logits, slots, any(r.filtered for r in rows))
        self._tok[slots] = picked[0].long()[:, None]
        self._count[slots] = 1
        for slot, row in zip(free, rows, strict=True):
            self.rows[slot] = row
        return self._settle(free, picked.tolist())

    def _needed(self, row: Row) -> int:
        need = len(row.prompt) + row.max_tokens
        return min(need, self._max_positions) if self._max_positions else need

    def _size_cache(self, needed: int) -> None:
        """A cache of at least `needed` columns, reused when it is not much longer."""
        length = -(-needed // _LENGTH_STEP) * _LENGTH_STEP
        if self._max_positions:
            length = min(length, self._max_positions)
        current = self._cache
        if current is not None and length <= current.length < 4 * length:
            return
        self._cache = SlotCache(self._pos, length)
        self._captured.clear()  # graphs read the old buffers
        self._columns = torch.arange(length, device=self._device)

    def _prefill(self, rows: list[Row]) -> tuple[torch.Tensor, object, int]:
        """One right-padded forward pass over the prompts: logits at each last token."""
        from transformers import DynamicCache

        ids, mask = right_pad([r.prompt for r in rows], self._pad_id)
        ids, mask = ids.to(self._device), mask.to(self._device)
        width = ids.shape[1]
        positions = torch.arange(width, device=self._device)[None].expand(len(rows), width)
        last = mask.sum(dim=1) - 1
        cache = DynamicCache()
        with torch.no_grad():
            logits = next_token_logits(self._model, ids, mask, positions, cache, last)
        self.prefills += 1
        return logits, cache, width

    # ----- stepping -----------------------------------------------------------------------

    def step(self) -> list[Row]:
        """One decode step for every occupied slot; returns the rows that finished."""
        occupied = [s for s, row in enumerate(self.rows) if row is not None]
        if not occupied:
            return []
        bucket = min(b for b in self._buckets if b > occupied[-1])
        filtered = any(row.filtered for row in self.rows if row is not None)
        if self._graphs:
            self._graph(bucket, filtered).replay()
        else:
            with torch.no_grad():
                self._step(bucket, filtered)
        tokens, logprobs = self._out[:, :bucket].tolist()  # the step's one transfer to the host
        return self._settle(
            occupied, [[tokens[s] for s in occupied], [logprobs[s] for s in occupied]]
        )

    def _step(self, rows: int, filtered: bool) -> None:
        """The captured body: forward the current tokens, pick the next, advance."""
        assert self._cache is not None
        tok, pos = self._tok[:rows], self._pos[:rows]
        mask = (self._columns[None, :] <= pos).view(rows, 1, 1, -1)
        logits = next_token_logits(self._model, tok, mask, pos, self._cache.bucket(rows))
        picked = self._select(logits, slice(0, rows), filtered)
        self._out[:, :rows].copy_(picked)
        tok.copy_(picked[0].long()[:, None])
        pos.add_(1)
        self._count[:rows].add_(1)

    def _select(self, logits: torch.Tensor, slots, filtered: bool) -> torch.Tensor:
        """Tokens and raw logprobs [2, rows] for `slots` (an index tensor or a slice)."""
        return select_tokens(
            logits,
            self._temp[slots],
            self._top_k[slots],
            self._top_p[slots],
            row_keys(self._seed[slots], self._count[slots]),
            filtered=filtered,
        )

    def _graph(self, rows: int, filtered: bool) -> torch.cuda.CUDAGraph:
        key = (rows, filtered)
        graph = self._captured.get(key)
        if graph is not None:
            return graph
        # Warm-up runs execute the step, so the state they advance is put back afterwards
        # (the cache columns they write are written again by the real step).
        saved = [t.clone() for t in (self._tok, self._pos, self._count)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(2):
                self._step(rows, filtered)
        torch.cuda.current_stream().wait_stream(stream)
        for tensor, value in zip((self._tok, self._pos, self._count), saved, strict=True):
            tensor.copy_(value)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # Thread-local: the trainer may run on another thread meanwhile (sampling takes no
        # host lock), and its allocations and copies must neither fail nor join the capture.
        capture = torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local")
        with capture, torch.no_grad():
            self._step(rows, filtered)
        self._captured[key] = graph
        self.captures += 1
        return graph

    def _settle(self, slots: list[int], values: list[list[float]]) -> list[Row]:
        done = []
        for slot, token, logprob in zip(slots, values[0], values[1], strict=True):
            row = self.rows[slot]
            assert row is not None
            record(row, int(token), logprob)
            if finished(row, self._decode, self._cache_limit()):
                done.append(row)
                self.rows[slot] = None
        return done

    def _cache_limit(self) -> int | None:
        return self._cache.length if self._cache is not None else self._max_positions
