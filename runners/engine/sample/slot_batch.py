"""Continuous batching over a static KV cache with one slot per row, decode steps replayed as
CUDA graphs (one per batch-size bucket) and, with graphs, launched one step ahead of the host.

Each row writes its keys and values at the column equal to its position, so rows of any
length share the cache without padding and a row joins by prefilling into a free slot. The
step (forward, token selection, bookkeeping) reads and writes only fixed tensors, so it is
captured once per bucket and replayed; adapters change by `copy_` into the sampling model's
tensors, which the graphs read in place. Without CUDA the same step runs eagerly, attending
only to the columns some row has reached, and the cache holds only the slots in use.

One step ahead: the next step is launched before the current step's tokens are read back
(the graph feeds its own tokens forward), so the host's bookkeeping overlaps the GPU's work;
a row that finished is retired one step late and its extra token dropped.

The model is either the sampler's packed model (`packed_model.PackedModel`, which writes the
slot cache itself) or a transformers module (`TransformersSlots` adapts it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from runners.engine.lora import LanguageModel
from runners.engine.padding import right_pad
from runners.engine.sample.batch import Passes, Row, ban_lists, finished, record
from runners.engine.sample.sampling_model import next_token_logits
from runners.engine.sample.selection import row_keys, select_tokens
from runners.engine.sample.slot_cache import AdapterIndex, SlotCache, SlotModel

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_LENGTH_STEP = 256  # cache lengths are multiples of this (fewer distinct graphs)
# One graph capture (its warm-up included) at a time in a process: a capture begins with a
# device-wide synchronize, which CUDA refuses while another thread's stream captures, breaking
# that capture too (a host holding two bases has a scheduler thread for each).
_ONE_CAPTURE_AT_A_TIME = threading.Lock()


class TransformersSlots:
    """A transformers module as a slot model: prefill through a DynamicCache copied into the
    slots, decode through the module with the slot cache standing in for its cache. It holds
    one adapter (in its own buffers), so rows' adapter slots are not read."""

    layout = 0
    trims = False  # its attention reads the whole cache

    def __init__(self, model: LanguageModel) -> None:
        self.model = model

    def allocate(self, cache: SlotCache, rows: int) -> None:
        pass  # sized after the first prefill, which knows the cache's shapes

    def prefill(self, ids, mask, last, cache, slots, adapters) -> torch.Tensor:
        from transformers import DynamicCache

        rows, width = ids.shape
        positions = torch.arange(width, device=ids.device)[None].expand(rows, width)
        prefill = DynamicCache()
        logits = next_token_logits(self.model, ids, mask, positions, prefill, last)
        if not cache.keys:
            cache.allocate(prefill)
        cache.place(slots, prefill, width)
        return logits

    def decode(self, tokens, positions, mask, cache, adapters) -> torch.Tensor:
        mask4d = mask.view(mask.shape[0], 1, 1, mask.shape[1])
        return next_token_logits(self.model, tokens, mask4d, positions, cache)


class SlotBatch:
    """The rows decoding now in fixed slots, and the captured step for each bucket."""

    def __init__(
        self,
        model: Any,
        *,
        slots: int,
        pad_id: int,
        device: torch.device,
        decode: Callable[[list[int]], str],
        max_positions: int | None,
        graphs: bool,
        ahead: bool | None = None,
    ) -> None:
        self._model: SlotModel = TransformersSlots(model) if isinstance(model, nn.Module) else model
        self._pad_id = pad_id
        self._device = device
        self._decode = decode
        self._max_positions = max_positions
        self._graphs = graphs and device.type == "cuda"
        # One step ahead where the host and the device work side by side (graphs), or when
        # asked (tests on the CPU check that it changes no token).
        self._ahead = self._graphs if ahead is None else ahead
        self.prefills = 0
        self.captures = 0
        self._pool: torch.cuda._POOL_HANDLE | None = None  # the captured graphs' shared memory
        self._cache: SlotCache | None = None
        self._captured: dict[tuple[int, Passes, bool], torch.cuda.CUDAGraph] = {}
        self._layout = self._model.layout  # the model's tensors the graphs were captured on
        # A launched step not yet read: its slots, their rows then, and its tokens' copy.
        self._pending: tuple[list[int], list[Row], torch.Tensor, Any] | None = None
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
        self._min = new(slots, dtype=torch.long, device=device)  # min_tokens
        self._ban = new((slots, 1), dtype=torch.long, device=device)  # stop ids until then
        self._adapter = torch.full((slots,), -1, dtype=torch.long, device=device)  # its slot
        self._out = new((2, slots), dtype=torch.float32, device=device)
        self._read = [torch.zeros_like(self._out, device="cpu") for _ in range(2)]
        if self._graphs:
            self._read = [t.pin_memory() for t in self._read]
        self._cache = None  # sized at the next join; graphs read the old tensors, so go too
        self._drop_graphs()
        self._pending = None

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
            self._pending = None  # what is still in flight belongs to rows already gone
            if len(rows) > self.slots:
                # One request with more samples than slots: the batch grows to hold it.
                self._allocate_slots(len(rows))
            self._size_cache(max(self._needed(row) for row in rows))
        assert self._cache is not None
        free = [s for s, row in enumerate(self.rows) if row is None][: len(rows)]
        self._model.allocate(self._cache, self._room(free[-1] + 1))
        slots = torch.tensor(free, device=self._device)
        ids, mask = right_pad([r.prompt for r in rows], self._pad_id)
        ids, mask = ids.to(self._device), mask.to(self._device)
        adapters = [r.adapter_slot for r in rows]
        self._adapter[slots] = torch.tensor(adapters, device=self._device)
        with torch.no_grad():
            logits = self._model.prefill(
                ids,
                mask,
                mask.sum(dim=1) - 1,
                self._cache,
                slots,
                AdapterIndex.of(adapters, self._device),
            )
        self.prefills += 1
        lengths = torch.tensor([len(r.prompt) for r in rows], device=self._device)
        self._set_settings(slots, rows)
        self._pos[slots] = lengths[:, None]
        picked = self._select(logits, slots, Passes.of(rows))
        self._tok[slots] = picked[0].long()[:, None]
        self._count[slots] = 1
        for slot, row in zip(free, rows, strict=True):
            self.rows[slot] = row
        tokens, logprobs = picked.tolist()
        return self._settle(free, list(rows), tokens, logprobs)

    def _set_settings(self, slots: torch.Tensor, rows: list[Row]) -> None:
        """Each joining row's sampling settings into its slot, its token count back to 0."""
        self._seed[slots] = torch.tensor([r.seed for r in rows], device=self._device)
        self._count[slots] = 0
        self._temp[slots] = torch.tensor([r.temperature for r in rows], device=self._device)
        self._top_k[slots] = torch.tensor([r.top_k for r in rows], device=self._device)
        self._top_p[slots] = torch.tensor([r.top_p for r in rows], device=self._device)
        # A row's min_tokens matters only with stop ids to ban (else its flag would ban id 0).
        minimum = [r.min_tokens if r.banning else 0 for r in rows]
        self._min[slots] = torch.tensor(minimum, device=self._device)
        self._set_bans(slots, rows)

    def _set_bans(self, slots: torch.Tensor, rows: list[Row]) -> None:
        lists = ban_lists(rows)
        width = len(lists[0])
        if width > self._ban.shape[1]:
            # A row with more stop ids than any before: wider lists (graphs read the old ones).
            wider = self._ban.new_zeros(self.slots, width)
            wider[:, : self._ban.shape[1]] = self._ban
            wider[:, self._ban.shape[1] :] = self._ban[:, :1]
            self._ban = wider
            self._drop_graphs()
        fill = [ids + [ids[0]] * (self._ban.shape[1] - width) for ids in lists]
        self._ban[slots] = torch.tensor(fill, device=self._device)

    def _needed(self, row: Row) -> int:
        need = len(row.prompt) + row.max_tokens
        return min(need, self._max_positions) if self._max_positions else need

    def _room(self, highest: int) -> int:
        """Slots the cache should hold to reach slot `highest - 1`: every slot when graphs
        read the buffers (they must never move), else the smallest bucket that fits."""
        if self._graphs:
            return self.slots
        return min(b for b in self._buckets if b >= highest)

    def _size_cache(self, needed: int) -> None:
        """A cache of at least `needed` columns, reused when it is not much longer."""
        length = -(-needed // _LENGTH_STEP) * _LENGTH_STEP
        if self._max_positions:
            length = min(length, self._max_positions)
        current = self._cache
        if current is not None and length <= current.length < 4 * length:
            return
        self._cache = SlotCache(self._pos, length)
        self._drop_graphs()  # graphs read the old buffers
        self._columns = torch.arange(length, device=self._device)

    # ----- stepping -----------------------------------------------------------------------

    def step(self) -> list[Row]:
        """One decode step for every occupied slot; returns the rows that finished (ahead:
        those of the step before, read while this one runs)."""
        occupied = [s for s, row in enumerate(self.rows) if row is not None]
        launched = self._launch(occupied) if occupied else None
        if not self._ahead:
            assert launched is not None
            return self._read_back(launched)
        pending, self._pending = self._pending, launched
        return self._read_back(pending) if pending is not None else []

    def _launch(self, occupied: list[int]) -> tuple[list[int], list[Row], torch.Tensor, Any]:
        """Run (or enqueue) the step for the bucket holding `occupied`; its tokens' copy."""
        assert self._cache is not None
        # A captured graph serves a bucket of slots; an eager step runs just as far as the
        # last occupied slot (on the CPU a padded row costs what a real one does).
        if self._graphs:
            bucket = min(b for b in self._buckets if b > occupied[-1])
        else:
            bucket = occupied[-1] + 1
        live = [row for row in self.rows if row is not None]
        passes = Passes.of(live)
        adapted = any(row.adapter_slot >= 0 for row in live)
        if self._graphs:
            self._graph(bucket, passes, adapted).replay()
        else:
            columns = self._cache.length
            if self._model.trims and not self._ahead:
                # The longest row's next position is its length so far: attend that far.
                columns = max(len(r.prompt) + len(r.tokens) for r in live)
            # A free slot's row is computed and dropped: it takes the live rows' adapter when
            # they share one, so a row's numbers do not hang on where the batch has holes.
            shared = {row.adapter_slot for row in live}
            free = shared.pop() if len(shared) == 1 else -1
            values = [free if row is None else row.adapter_slot for row in self.rows[:bucket]]
            adapters = AdapterIndex(self._adapter[:bucket], values, adapted)
            with torch.no_grad():
                self._step(bucket, passes, columns, adapters)
        read = self._read[0]
        self._read.reverse()  # the next step's copy goes to the other buffer
        # The whole buffer: a contiguous copy into pinned memory stays asynchronous.
        read.copy_(self._out, non_blocking=self._graphs)
        event = None
        if self._graphs:
            event = torch.cuda.Event()
            event.record()
        rows = [self.rows[s] for s in occupied]
        return occupied, rows, read[:, :bucket], event  # type: ignore[return-value]

    def _read_back(self, launched: tuple[list[int], list[Row], torch.Tensor, Any]) -> list[Row]:
        """Settle a launched step's rows that are still in their slots."""
        occupied, rows, read, event = launched
        if event is not None:
            event.synchronize()
        tokens, logprobs = read.tolist()  # the step's one transfer to the host
        keep = [i for i, slot in enumerate(occupied) if self.rows[slot] is rows[i]]
        return self._settle(
            [occupied[i] for i in keep],
            [rows[i] for i in keep],
            [tokens[occupied[i]] for i in keep],
            [logprobs[occupied[i]] for i in keep],
        )

    def _step(self, rows: int, passes: Passes, columns: int, adapters: AdapterIndex) -> None:
        """The captured body: forward the current tokens, pick the next, advance."""
        assert self._cache is not None
        tok, pos = self._tok[:rows], self._pos[:rows]
        mask = self._columns[None, :columns] <= pos
        logits = self._model.decode(tok, pos, mask, self._cache.bucket(rows), adapters)
        picked = self._select(logits, slice(0, rows), passes)
        self._out[:, :rows].copy_(picked)
        tok.copy_(picked[0].long()[:, None])
        pos.add_(1)
        self._count[:rows].add_(1)

    def _select(self, logits: torch.Tensor, slots, passes: Passes) -> torch.Tensor:
        """Tokens and raw logprobs [2, rows] for `slots` (an index tensor or a slice)."""
        count = self._count[slots]
        ban = (self._ban[slots], count < self._min[slots]) if passes.banning else None
        return select_tokens(
            logits,
            self._temp[slots],
            self._top_k[slots],
            self._top_p[slots],
            row_keys(self._seed[slots], count),
            filtered=passes.filtered,
            greedy=passes.greedy,
            ban=ban,
        )

    def _graph(self, rows: int, passes: Passes, adapted: bool) -> torch.cuda.CUDAGraph:
        assert self._cache is not None
        if self._model.layout != self._layout:
            self._drop_graphs()  # captured on tensors the model has since replaced
            self._layout = self._model.layout
        key = (rows, passes, adapted)
        graph = self._captured.get(key)
        if graph is not None:
            return graph
        with _ONE_CAPTURE_AT_A_TIME:
            graph = self._capture(rows, passes, adapted)
        self._captured[key] = graph
        self.captures += 1
        return graph

    def _capture(self, rows: int, passes: Passes, adapted: bool) -> torch.cuda.CUDAGraph:
        """Warm the step up on a side stream, then capture it (under the process's capture
        lock: the side stream comes from torch's pool, which can hand out the very stream that
        another thread captures on)."""
        assert self._cache is not None
        columns = self._cache.length
        # The rows' slots as the captured step reads them: the fixed buffer, no list.
        adapters = AdapterIndex(self._adapter[:rows], None, adapted)
        # Warm-up runs execute the step, so the state they advance is put back afterwards
        # (the cache columns they write are written again by the real step).
        saved = [t.clone() for t in (self._tok, self._pos, self._count)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(2):
                self._step(rows, passes, columns, adapters)
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
            self._step(rows, passes, columns, adapters)
        return graph

    def _drop_graphs(self) -> None:
        """Forget the captured graphs and their memory pool: once its last graph is freed,
        CUDA's allocator refuses a capture into that pool (an internal assert)."""
        self._captured.clear()
        self._pool = None

    def _settle(
        self, slots: list[int], rows: list[Row], tokens: list[float], logprobs: list[float]
    ) -> list[Row]:
        done = []
        for slot, row, token, logprob in zip(slots, rows, tokens, logprobs, strict=True):
            record(row, int(token), logprob)
            if finished(row, self._decode, self._cache_limit()):
                done.append(row)
                self.rows[slot] = None
        return done

    def _cache_limit(self) -> int | None:
        return self._cache.length if self._cache is not None else self._max_positions
