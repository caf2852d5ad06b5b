"""The slot cache a slot batch decodes into (one fixed KV slot per row), each row's adapter slot
(`AdapterIndex`), and what a model must offer to decode over them (`SlotModel`): the batch and
the models both import this, not each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from runners.engine.lora import LanguageModel
from runners.engine.sample import decode_attention
from runners.engine.sample.sampling_model import plain_head


@dataclass(frozen=True)
class AdapterIndex:
    """Each row's adapter slot for one forward pass (-1: the base model alone): `tensor` on the
    device (a fixed buffer under captured graphs), `values` the same as a list where the pass
    runs eagerly (None inside a captured one), `adapted` whether any row has an adapter."""

    tensor: torch.Tensor
    values: list[int] | None
    adapted: bool

    @staticmethod
    def of(values: list[int], device: torch.device) -> AdapterIndex:
        tensor = torch.tensor(values, dtype=torch.long, device=device)
        return AdapterIndex(tensor, list(values), any(v >= 0 for v in values))

    def repeated(self, times: int) -> AdapterIndex:
        """Each row's slot for each of its `times` tokens (a prefill's)."""
        values = None if self.values is None else [v for v in self.values for _ in range(times)]
        return AdapterIndex(self.tensor.repeat_interleave(times), values, self.adapted)


class SlotCache:
    """Keys and values [slots, heads, length, head_dim] per layer; row r writes at column
    `positions[r]` (clamped, so a free slot's stale position stays in bounds)."""

    def __init__(self, positions: torch.Tensor, length: int) -> None:
        self.positions = positions  # [slots, 1], shared with the batch's step inputs
        self.length = length
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.rows = positions.shape[0]  # rows the model sees (a bucket's leading slots)

    @property
    def capacity(self) -> int:
        """Slots the buffers hold (0 before they are allocated)."""
        return self.keys[0].shape[0] if self.keys else 0

    def allocate(self, like: object) -> None:
        """Size the buffers after a prefill cache (layers, heads, head_dim, dtype)."""
        layer = like.layers[0]  # type: ignore[attr-defined]
        k = layer.keys
        self.allocate_for(
            len(like.layers),  # type: ignore[attr-defined]
            k.shape[1],
            k.shape[3],
            k.dtype,
            k.device,
            self.positions.shape[0],
        )

    def allocate_for(
        self,
        layers: int,
        heads: int,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        rows: int,
    ) -> None:
        """Buffers for `rows` slots (more than before: the old rows are copied over)."""
        if rows <= self.capacity:
            return
        shape = (rows, heads, self.length, dim)
        old = self.capacity
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        for new, previous in zip(keys + values, self.keys + self.values, strict=False):
            new[:old].copy_(previous)
        self.keys, self.values = keys, values

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


class SlotModel(Protocol):
    """What a slot batch needs of its model."""

    trims: bool  # whether a step may attend to fewer columns than the cache holds

    @property
    def layout(self) -> int:
        """Changes when the tensors a captured step reads are reallocated (graphs then go)."""
        ...

    def allocate(self, cache: SlotCache, rows: int) -> None:
        """Make room in `cache` for at least `rows` slots (or leave it to the first prefill)."""
        ...

    def prefill(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        last: torch.Tensor,
        cache: SlotCache,
        slots: torch.Tensor,
        adapters: AdapterIndex,
    ) -> torch.Tensor:
        """Right-padded prompts into `slots`, each row on its adapter slot; logits [rows,
        vocab] at each row's `last`."""
        ...

    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: SlotCache,
        adapters: AdapterIndex,
    ) -> torch.Tensor:
        """One token per row of `cache` (a bucket), each on its adapter slot, attending where
        `mask` [rows, columns] allows (columns may stop short of the cache's length when
        `trims`)."""
        ...


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
