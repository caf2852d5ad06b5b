"""Which adapters the sampler's model holds in its slots, and who holds each slot now.

A request holds its adapter's slot from admission until it is answered. An adapter already in
a slot is found there; a new one takes an open slot no request holds and no waiting request
wants (an empty one first, else the least recently used, whose adapter is evicted: loaded again
if it comes back). Without the look at the waiting requests, more adapters than slots taken in
turn would each evict the next one's. Only when no open slot is left to take does another open,
up to `slots` (after that a wanted one is evicted all the same), so the slots the model keeps in
memory follow the most adapters that decoded at once (the model rounds up to a power of two),
not the setting. When all are open and held, the request waits. The base model needs no slot
on a model whose rows can skip the adapter products (slot -1); a one-slot model (transformers'
copy) loads it like an adapter. An adapter whose sampler closed leaves its slot once no request
holds it (`empty`), and empty slots at the end close, their memory with them (`shrink`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from itertools import count

from runners.engine.host import AdapterWeights

BASE = -1  # the slot of the base model alone, on a model with slots to skip


@dataclass
class _Slot:
    adapter: int | None = None  # the adapter's id (0: the base model); None: empty
    holds: int = 0
    used: int = 0  # when it was last held or let go (a tick)


class AdapterTable:
    def __init__(
        self,
        slots: int,
        load: Callable[[int, AdapterWeights | None], None],
        *,
        base_takes_slot: bool,
        shrink: Callable[[int], None] | None = None,
    ) -> None:
        """`load(slot, adapter)`: copy an adapter (None: the base model) into a slot of the
        model; it may raise ValueError (the adapter does not fit), and the slot is then empty.
        `shrink(open)`: the model keeps only its first `open` slots (the others closed)."""
        self._limit = max(1, slots)
        self._slots: list[_Slot] = []  # the open ones
        self._load = load
        self._shrink = shrink
        self._base_takes_slot = base_takes_slot
        self._ticks = count(1)

    def hold(self, adapter: AdapterWeights | None, wanted: Collection[int] = ()) -> int | None:
        """The slot `adapter` decodes in, held until `let_go`; None: every slot is held by
        requests on other adapters (wait for one to be let go). `wanted`: the ids of the
        adapters that waiting requests are on (evicted last)."""
        if adapter is None and not self._base_takes_slot:
            return BASE
        key = 0 if adapter is None else adapter.id
        for index, slot in enumerate(self._slots):
            if slot.adapter == key:
                return self._held(index)
        free = [i for i, s in enumerate(self._slots) if s.holds == 0]
        unwanted = [i for i in free if self._slots[i].adapter not in wanted]
        if unwanted:
            index = min(unwanted, key=self._eviction_order)
        elif len(self._slots) < self._limit:
            index = len(self._slots)
            self._slots.append(_Slot())
        elif free:  # every free slot's adapter is wanted and no slot can open
            index = min(free, key=self._eviction_order)
        else:
            return None
        slot = self._slots[index]
        slot.adapter = None
        self._load(index, adapter)  # a ValueError leaves the slot empty
        slot.adapter = key
        return self._held(index)

    def _eviction_order(self, index: int) -> tuple[bool, int]:
        slot = self._slots[index]
        return slot.adapter is not None, slot.used

    def let_go(self, index: int) -> None:
        if index == BASE:
            return
        slot = self._slots[index]
        slot.holds -= 1
        slot.used = next(self._ticks)

    def _held(self, index: int) -> int:
        slot = self._slots[index]
        slot.holds += 1
        slot.used = next(self._ticks)
        return index

    def empty(self, adapters: Collection[int]) -> set[int]:
        """Empty the slots of `adapters` (ids whose samplers closed) that no request holds, and
        close the empty slots at the end; the ids still held (to empty once let go)."""
        held = set()
        for slot in self._slots:
            if slot.adapter is not None and slot.adapter in adapters:
                if slot.holds:
                    held.add(slot.adapter)
                else:
                    slot.adapter = None
        opened = len(self._slots)
        while self._slots and self._slots[-1].adapter is None and not self._slots[-1].holds:
            self._slots.pop()
        if len(self._slots) < opened and self._shrink is not None:
            self._shrink(len(self._slots))
        return held

    def resident(self) -> list[tuple[int | None, int]]:
        """(adapter id or None, holds) per open slot; id 0 is the base model."""
        return [(s.adapter, s.holds) for s in self._slots]
