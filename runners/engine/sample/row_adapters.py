"""Which adapter slot each row of one forward pass uses, worked out once per pass for all of its
product groups: on the masked route (CUDA graphs) a mask per group width, computed on the device
from the rows' slot index; on the CPU's route the rows grouped by slot (`RowGroups`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowGroups:
    """Rows grouped by slot for the CPU's batched adapter products. `single`: every row is on
    that one slot (its views are used as they are, nothing gathered). Else the slots `low` ..
    `low + blocks - 1` hold every adapted row, `per` rows a block: `gather` lists each block's
    rows (padding repeats row 0, computed and never read), `back` finds each adapted row's
    place in the blocks, and `rows` names the adapted rows (None: all of them). `gather` None:
    the rows are the blocks already, in order (a batch that formed at once, its rows joined in
    slot order: the rows are viewed as blocks, nothing gathered)."""

    rank: int  # the largest rank loaded in the slots used: products over that many ranks
    single: int | None
    low: int = 0
    blocks: int = 0
    per: int = 0
    gather: torch.Tensor | None = None
    back: torch.Tensor | None = None
    rows: torch.Tensor | None = None


def group_rows(slots: Sequence[int], ranks: Sequence[int], device: torch.device) -> RowGroups:
    """`slots`: each row's slot (-1: the base model alone, no update); `ranks`: each slot's
    loaded rank. At least one row must be adapted."""
    used = sorted({s for s in slots if s >= 0})
    rank = max(ranks[s] for s in used)
    if len(used) == 1 and all(s == used[0] for s in slots):
        return RowGroups(rank=rank, single=used[0])
    low = used[0]
    blocks = used[-1] - low + 1
    counts = [0] * blocks
    for s in slots:
        if s >= 0:
            counts[s - low] += 1
    per = max(counts)
    if len(slots) == blocks * per and all(s == low + r // per for r, s in enumerate(slots)):
        return RowGroups(rank=rank, single=None, low=low, blocks=blocks, per=per)
    gather = [0] * (blocks * per)
    back = []
    adapted = []
    filled = [0] * blocks
    for row, s in enumerate(slots):
        if s < 0:
            continue
        at = (s - low) * per + filled[s - low]
        filled[s - low] += 1
        gather[at] = row
        back.append(at)
        adapted.append(row)
    return RowGroups(
        rank=rank,
        single=None,
        low=low,
        blocks=blocks,
        per=per,
        gather=torch.tensor(gather, device=device),
        back=torch.tensor(back, device=device),
        rows=None if len(adapted) == len(slots) else torch.tensor(adapted, device=device),
    )


class RowAdapters:
    """One forward pass's rows (or tokens, in a prefill) and their adapter slots."""

    def __init__(
        self,
        index: torch.Tensor,
        adapted: bool,
        groups: RowGroups | None,
        slot_count: int,
    ) -> None:
        self.index = index  # [rows] long on the device; -1: the base model alone
        self.adapted = adapted  # some row has an adapter (else no adapter product runs)
        self.groups = groups  # the CPU route's grouping (None on the masked route)
        self._slot_count = slot_count
        self._masks: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def mask(self, width: int, dtype: torch.dtype) -> torch.Tensor:
        """[rows, slots * width]: 1 on the `width` columns of each row's own slot, else 0 (a
        row of the base model: all 0); computed once per width and pass, on the device."""
        key = (width, dtype)
        mask = self._masks.get(key)
        if mask is None:
            columns = torch.arange(self._slot_count * width, device=self.index.device) // width
            mask = (columns[None, :] == self.index[:, None]).to(dtype)
            self._masks[key] = mask
        return mask
