"""One product group of the packed model: linear layers that read the same input as one base
weight, and the sampler's K adapter slots beside it, each row's update from its own slot.

Two routes for the adapters, the same numbers:
- apart (the CPU): every slot's A^T [in, ranks] and B^T [ranks, out] stacked over the slots in
  float32 (bf16 copies for wide products, `EXACT_ADAPTER_OUTPUTS`); one slot for every row: two
  `mm` on its views; several: the rows gathered into [slots, per slot, in] blocks, two `bmm`,
  gathered back (the fastest of `bmm`, `grouped_mm` and a loop per slot at 4-32 rows and 1-8
  adapters: benchmarks/README.md, "Many tenants, one batch"). A bf16 sampler with the fused
  kernel (`lora_rows.py`) takes up to `KERNEL_ROWS` rows through it instead: one call, every
  slot's weights read once in bf16, float32 sums;
- masked (CUDA, where steps are captured graphs): every slot's A rows stacked under the base
  weight, so one product gives the base outputs and every slot's `x A^T`; a mask keeps each
  row's own slot's columns and one product with the stacked B adds the update. The graphs read
  the rows' slot index, a fixed buffer, and compute the mask from it.

Ranks are interleaved (row j * members + i holds rank j of member i), so an adapter of rank r
fills the first r * members rows of its slot and a product over those rows covers it. Lower
ranks and layers an adapter does not target stay zero, which adds nothing: one copy of the base
serves adapters of every rank and target set. There are as many slots as the model has open,
as wide as the largest rank loaded so far (`reserve`; `shrink` closes the last ones).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runners.engine.sample.cpu_products import OneDnnProduct, Threads
from runners.engine.sample.lora_rows import LoraRows
from runners.engine.sample.row_adapters import RowAdapters, RowGroups

# Up to this many outputs (rows x a group's outputs) the adapter's products run in float32
# (exact; a third of a tiny bf16 product's time); beyond, in the sampling dtype, where a
# float32 update of every output costs more than it saves (SmolLM2 on one thread: gate/up's
# 3,072 outputs at 3 rows 35 us against 61, at 64 rows 298 against 90; the head's 49,152 at
# 3 rows 336 against 365, at 16 rows 5.4 ms against 0.4).
EXACT_ADAPTER_OUTPUTS = 32768
# Up to this many rows (a decode step's, a short prefill's) the fused kernel adds the updates;
# beyond, torch's products on the blocks are as fast or faster (benchmarks/README.md).
KERNEL_ROWS = 64


def _stacked_bias(layers: list[nn.Linear], weight: torch.Tensor) -> torch.Tensor | None:
    """The layers' biases stacked as their rows are in `weight` (zeros for a layer without
    one, in `weight`'s dtype); None when no layer has one."""
    if not any(layer.bias is not None for layer in layers):
        return None
    bias = weight.new_zeros(weight.shape[0])
    at = 0
    for layer in layers:
        if layer.bias is not None:
            bias[at : at + layer.out_features] = layer.bias.detach().to(weight.dtype)
        at += layer.out_features
    return bias


class PackedGroup:
    """The base rows of the group's layers, and adapter slots of `members` layers each (`slots`
    to begin with; more as `reserve` opens them)."""

    def __init__(
        self,
        layers: list[nn.Linear],
        names: list[str],
        dtype: torch.dtype,
        slots: int,
        *,
        masked: bool,
        columns: torch.Tensor | None = None,
    ) -> None:
        """`names`: the layers' names in the base model (an adapter's layers are found by
        them). `columns`: the weight of the RMSNorm that feeds the group, folded into its input
        columns (W diag(w) x = W (w * x): the norm's multiply disappears from the step), and
        into each adapter's A as it loads."""
        base = torch.cat([layer.weight.detach() for layer in layers]).float()
        self.columns = None if columns is None else columns.detach().float()
        base = base if self.columns is None else base * self.columns
        self.dtype = dtype
        self.names = names
        self.widths = [layer.out_features for layer in layers]
        self.members = len(layers)
        self.out, self.inputs = base.shape
        self.slots = slots
        self.masked = masked
        self.rank = 0  # ranks per member a slot holds now (grown by loads)
        self.weight = base.to(dtype)  # masked: the base rows, then every slot's A rows
        self.base: torch.Tensor | None = self.weight
        self.base_bias = _stacked_bias(layers, self.weight)
        self.bias = self.base_bias  # the masked route's, as long as its weight
        adapter_dtype = dtype if masked else torch.float32
        self.a_t = torch.zeros(slots, self.inputs, 0, dtype=adapter_dtype, device=base.device)
        self.b_t = torch.zeros(slots, 0, self.out, dtype=adapter_dtype, device=base.device)
        self.low_a_t, self.low_b_t = self.a_t, self.b_t  # the apart route's sampling-dtype copies
        self._onednn: OneDnnProduct | None = None
        self._kernel: LoraRows | None = None
        self._kernel_threads = Threads(1)  # the step's, once the kernel is in use
        # The kernel's copy of each slot's A rows, [slots, ranks, in] in bf16 (made by use_kernel).
        self.rows_a = self.a_t.new_empty(0)
        # A and B views by (first slot, slots, ranks, exact): made once, not at every product.
        self._views: dict[tuple[int, int, int, bool], tuple[torch.Tensor, torch.Tensor]] = {}

    # ----- slots ----------------------------------------------------------------------------

    def reserve(self, slots: int, rank: int) -> bool:
        """At least `slots` slots at least `rank` ranks wide (what they hold kept); whether the
        tensors changed."""
        if slots <= self.slots and rank <= self.rank:
            return False
        slots, rank = max(slots, self.slots), max(rank, self.rank)
        width, old = rank * self.members, self.rank * self.members
        if self.masked:
            weight = self.weight.new_zeros(self.out + slots * width, self.inputs)
            weight[: self.out] = self.weight[: self.out]
            stacked = weight[self.out :].view(slots, width, self.inputs)
            stacked[: self.slots, :old] = self.weight[self.out :].view(self.slots, old, self.inputs)
            self.weight, self.base = weight, weight[: self.out]
            if self.base_bias is not None:
                self.bias = torch.cat(
                    [self.base_bias, self.base_bias.new_zeros(len(weight) - self.out)]
                )
        else:
            a_t = self.a_t.new_zeros(slots, self.inputs, width)
            a_t[: self.slots, :, :old] = self.a_t
            self.a_t = a_t
        b_t = self.b_t.new_zeros(slots, width, self.out)
        b_t[: self.slots, :old] = self.b_t
        self.b_t = b_t
        self.slots, self.rank = slots, rank
        self._copy_low(slice(None))
        self._views.clear()
        return True

    def shrink(self, slots: int) -> bool:
        """Only the first `slots` slots kept (what they hold too), the others' memory given
        back; whether the tensors changed."""
        if slots >= self.slots:
            return False
        width = self.rank * self.members
        if self.masked:
            self.weight = self.weight[: self.out + slots * width].clone()
            self.base = self.weight[: self.out]
            if self.bias is not None:
                self.bias = self.bias[: len(self.weight)].clone()
        else:
            self.a_t = self.a_t[:slots].clone()
        self.b_t = self.b_t[:slots].clone()
        self.slots = slots
        self._copy_low(slice(None))
        self._views.clear()
        return True

    def load(
        self, slot: int, layers: dict[str, tuple[torch.Tensor, torch.Tensor]], scale: float
    ) -> None:
        """Slot `slot` holds the adapter whose layers are `layers` (name -> A [rank, in],
        B [out, rank]; the group's members it lacks stay zero), B scaled by `scale`."""
        m = self.members
        a_rows = self._a_rows(slot)
        a_rows.zero_()
        self.b_t[slot].zero_()
        at = 0
        for i, (name, width) in enumerate(zip(self.names, self.widths, strict=True)):
            pair = layers.get(name)
            if pair is not None:
                a, b = pair
                rank = a.shape[0]
                if a.shape != (rank, self.inputs) or b.shape != (width, rank) or rank > self.rank:
                    raise ValueError(
                        f"adapter layer {name} has A {tuple(a.shape)} and B {tuple(b.shape)}; "
                        f"this model's layer takes A [rank, {self.inputs}] and B [{width}, rank]"
                    )
                a = a.detach().float()
                if self.columns is not None:
                    a = a * self.columns
                a_rows[i : rank * m : m] = a.to(a_rows.dtype)
                self.b_t[slot, i : rank * m : m, at : at + width] = (
                    b.detach().float().t() * scale
                ).to(self.b_t.dtype)
            at += width
        self._copy_low(slot)

    def _a_rows(self, slot: int) -> torch.Tensor:
        """Slot `slot`'s A rows [ranks, in] (a view the products read)."""
        if self.masked:
            width = self.rank * self.members
            start = self.out + slot * width
            return self.weight[start : start + width]
        return self.a_t[slot].t()

    def _copy_low(self, slots: int | slice) -> None:
        """The apart route's sampling-dtype copies of A and B (and the kernel's A rows), after a
        load or a growth."""
        if self.masked:
            return
        if self.dtype == torch.float32:
            self.low_a_t, self.low_b_t = self.a_t, self.b_t
            return
        if self.low_a_t.shape != self.a_t.shape:
            self.low_a_t = self.a_t.to(self.dtype)
            self.low_b_t = self.b_t.to(self.dtype)
            self._views.clear()
        else:
            self.low_a_t[slots] = self.a_t[slots]
            self.low_b_t[slots] = self.b_t[slots]
        if self._kernel is not None:
            if self.rows_a.shape != self.low_a_t.transpose(1, 2).shape:
                self.rows_a = self.low_a_t.transpose(1, 2).contiguous()
            else:
                self.rows_a[slots] = self.low_a_t[slots].transpose(-1, -2)

    def use_kernel(self, kernel: LoraRows, threads: Threads) -> None:
        """Adapter updates of up to `KERNEL_ROWS` rows through the fused kernel (a bf16 copy),
        its blocks of rows shared among the step's threads for its products."""
        assert not self.masked and self.dtype == torch.bfloat16, "the kernel reads bf16 slots"
        self._kernel, self._kernel_threads = kernel, threads
        self._copy_low(slice(None))

    def use_onednn(self, threads: Threads, keep_plain: bool) -> None:
        """Base products through oneDNN's packed weight (the CPU; the adapter apart). The
        plain copy goes unless `keep_plain` (a tied unembedding is also the embedding)."""
        assert not self.masked, "oneDNN's route keeps the adapter apart"
        self._onednn = OneDnnProduct(self.weight, self.base_bias, threads)
        if not keep_plain:
            self.base = None
            self.weight = self.weight.new_empty(0, self.inputs)

    def nbytes(self, adapted: bool) -> int:
        """Bytes a product of the group reads (every slot's adapter too when `adapted`)."""
        base = self.out * self.inputs * torch.empty((), dtype=self.dtype).element_size()
        if not adapted or not self.rank:
            return base
        if self.masked:
            return self.weight.nbytes + self.b_t.nbytes
        return base + self.a_t.nbytes + self.b_t.nbytes

    # ----- products ---------------------------------------------------------------------------

    def __call__(self, x: torch.Tensor, rows: RowAdapters) -> torch.Tensor:
        """The group's outputs [tokens, out], each row's adapter update added."""
        return self._product(x, None, rows)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor, rows: RowAdapters) -> torch.Tensor:
        """`residual` plus the group's outputs (o and down: the residual add in the product)."""
        return self._product(x, residual, rows)

    def _product(
        self, x: torch.Tensor, residual: torch.Tensor | None, rows: RowAdapters
    ) -> torch.Tensor:
        adapted = rows.adapted and self.rank > 0
        if self.masked and adapted:
            return self._masked(x, residual, rows)
        if self._onednn is not None:
            y = self._onednn(x, residual)
        elif residual is None:
            y = F.linear(x, self.weight[: self.out], self.base_bias)
        elif self.base_bias is None:
            y = torch.addmm(residual, x, self.weight[: self.out].t())
        else:
            y = residual + F.linear(x, self.weight[: self.out], self.base_bias)
        if adapted:
            assert rows.groups is not None, "the CPU route groups its rows"
            if self._kernel is not None and len(x) <= KERNEL_ROWS:
                used = rows.groups.rank * self.members
                self._kernel.add(
                    x.contiguous(), y, self.rows_a, self.low_b_t, rows.index, used,
                    self._kernel_threads.products,
                )  # fmt: skip
            else:
                self._add_apart(x, y, rows.groups)
        return y

    def _masked(
        self, x: torch.Tensor, residual: torch.Tensor | None, rows: RowAdapters
    ) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        h = y[:, self.out :] * rows.mask(self.rank * self.members, y.dtype)
        b_t = self.b_t.view(-1, self.out)
        if residual is None:
            return torch.addmm(y[:, : self.out], h, b_t)
        return (residual + y[:, : self.out]).addmm_(h, b_t)

    def _add_apart(self, x: torch.Tensor, y: torch.Tensor, groups: RowGroups) -> None:
        """y += each row's `x A^T B^T` from its own slot: float32 (exact) on a step's few
        outputs, in the sampling dtype beyond."""
        exact = y.numel() <= EXACT_ADAPTER_OUTPUTS
        x = x.float() if exact else x
        if groups.single is not None:
            a_t, b_t = self._slot_views(groups.single, 0, groups.rank, exact)
            if exact:
                y.add_(torch.mm(torch.mm(x, a_t), b_t))
            else:
                y.addmm_(torch.mm(x, a_t), b_t)
            return
        a_t, b_t = self._slot_views(groups.low, groups.blocks, groups.rank, exact)
        shape = (groups.blocks, groups.per)
        rows = x if groups.gather is None else x.index_select(0, groups.gather)
        update = torch.bmm(torch.bmm(rows.view(*shape, self.inputs), a_t), b_t)
        if groups.gather is None:
            y.view(*shape, self.out).add_(update)
            return
        assert groups.back is not None
        update = update.view(-1, self.out).index_select(0, groups.back)
        if groups.rows is not None:  # some rows are the base model's: no update there
            update = update.new_zeros(len(y), self.out).index_copy_(0, groups.rows, update)
        y.add_(update)

    def _slot_views(
        self, first: int, count: int, rank: int, exact: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A^T and B^T over `rank` ranks of slot `first` ([in, ranks], [ranks, out]; count 0)
        or of slots first .. first + count - 1 ([count, in, ranks], [count, ranks, out])."""
        key = (first, count, rank, exact)
        views = self._views.get(key)
        if views is None:
            a_t, b_t = (self.a_t, self.b_t) if exact else (self.low_a_t, self.low_b_t)
            ranks = rank * self.members
            at = first if count == 0 else slice(first, first + count)
            views = (a_t[at][..., :ranks], b_t[at][..., :ranks, :])
            self._views[key] = views
        return views
