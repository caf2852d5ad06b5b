"""One loaded model shared by training clients and their samplers, with a lock and adapter swaps.

Each training client owns its LoRA tensors (a LiveAdapter); the host's LoRA parameters point
at the tensors of the client that last worked (`training`), so clients of one LoRA shape on
one training lane share one model (the base's lanes, SharedBase, train side by side).
Sampling clients hold frozen copies of the LoRA tensors only (never of the base model), which
the base's one decode scheduler applies by layer name, whatever their shape; a forward pass
of the trainer's model under `use(adapter)` points the LoRA parameters at that copy for its
duration.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count
from typing import Any

import torch
from torch import nn

from runners.engine import heap, lora
from runners.engine.fair_lock import FairLock

_adapter_ids = count(1)
_PEFT_PREFIX = "base_model.model."
_LORA_PARTS = {".lora_A.default.weight": 0, ".lora_B.default.weight": 1}


class AdapterWeights:
    """A frozen copy of LoRA tensors by parameter name, with the scale (alpha / rank) and rank
    they are applied with; the sampler tells adapters apart by `id` (never reused)."""

    def __init__(self, tensors: dict[str, torch.Tensor], scale: float, rank: int) -> None:
        self.tensors = tensors
        self.scale = scale
        self.rank = rank
        self.id = next(_adapter_ids)

    def layers(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Each adapted layer's A [rank, in] and B [out, rank], by the layer's name in the
        base model (`model.layers.0.self_attn.q_proj`)."""
        pairs: dict[str, list[torch.Tensor]] = {}
        for name, tensor in self.tensors.items():
            for suffix, part in _LORA_PARTS.items():
                if name.endswith(suffix):
                    layer = name.removeprefix(_PEFT_PREFIX).removesuffix(suffix)
                    pairs.setdefault(layer, [tensor, tensor])[part] = tensor
        return {layer: (a, b) for layer, (a, b) in pairs.items()}


class SharedBase:
    """What every host built on one base model shares: its training lanes, a lock each (granted
    in arrival order, so the clients of a lane take turns first come, first served), a count of
    the passes running on them, and the one decode scheduler that samples every adapter on it
    (see scheduler.scheduler_for)."""

    def __init__(self, name: str, lanes: int = 1) -> None:
        self.name = name
        self.lanes = [FairLock() for _ in range(lanes)]
        self._passes = 0
        self._passes_lock = threading.Lock()

    @contextmanager
    def training_pass(self, budget: int, lengths: list[int]) -> Iterator[int]:
        """A forward (+ backward) pass of datums of `lengths` tokens: its micro-batch token
        budget, `budget` alone; while another lane's pass runs, its rows in as many
        micro-batches as there are lanes, so two passes side by side hold about one and a half
        passes' activations, not two."""
        with self._passes_lock:
            self._passes += 1
            beside_another = self._passes > 1
        try:
            if beside_another and lengths:
                rows_each = -(-len(lengths) // len(self.lanes))
                budget = min(budget, max(lengths) * rows_each)
            yield budget
        finally:
            with self._passes_lock:
                self._passes -= 1


class LiveAdapter:
    """One training client's LoRA tensors and gradients, by parameter name. While its client
    works (ModelHost.training) the host's parameters hold these very tensors, so in-place
    updates (the optimizer's) land here."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.grads: dict[str, torch.Tensor | None] = dict.fromkeys(tensors)


class ModelHost:
    """A model (plain or peft-wrapped), its tokenizer, and the lock every forward pass takes."""

    def __init__(
        self,
        base_model: str,
        model: lora.LanguageModel,
        tokenizer: Any,
        *,
        max_batch_sequences: int = 64,
        batch_window_s: float = 0.005,
        sampling_dtype: str = "auto",
        shared: SharedBase | None = None,
        adapter_slots: int = 8,
        max_lora_rank: int = 128,
        cpu_adapter_kernel: bool = True,
        cast_lm_head_to_fp32: bool = True,
        on_unused: Callable[[ModelHost], None] | None = None,
        lane: int = 0,
    ) -> None:
        self.base_model = base_model
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        # One forward or backward at a time on each of the base's training lanes (hosts on one
        # lane share its lock, so their clients' steps never interleave, and take turns);
        # the lanes' passes run side by side (bases.py gives a LoRA shape a host per lane).
        self.shared = shared or SharedBase(base_model)
        self.lane = lane
        self.lock = self.shared.lanes[lane]
        self.active: LiveAdapter | None = None  # whose tensors the LoRA parameters hold
        # Clients and samplers using this host; the last one's release calls `on_unused`. A
        # lock of its own: a new sampler (a step's snapshot) must not wait for the base's lock,
        # which another client holds for a whole training step.
        self.users = 0
        self._users_lock = threading.Lock()
        self._on_unused = on_unused
        self._read_adapter(model)
        # The sampler's adapter slots: how many adapters decode side by side, and the largest
        # rank a slot takes (see packed_model.py).
        self.adapter_slots = adapter_slots
        self.max_lora_rank = max_lora_rank
        self.cpu_adapter_kernel = cpu_adapter_kernel  # a bf16 CPU sampler's (lora_rows.py)
        # A bf16 sampler's logits from a float32 unembedding (packed_model.py).
        self.cast_lm_head_to_fp32 = cast_lm_head_to_fp32
        self.max_batch_sequences = max_batch_sequences
        self.batch_window_s = batch_window_s
        self.sampling_dtype = sampling_dtype  # see sampling_model.resolve_sampling_dtype
        # What runs on this host and must end with it (its decode scheduler, see
        # scheduler.scheduler_for): the host itself does not know schedulers.
        self._closers: list[Callable[[], None]] = []
        self._closers_lock = threading.Lock()
        self.closed = False  # for good: its owner let it go (its weights may be freed)

    def _read_adapter(self, model: lora.LanguageModel) -> None:
        """The LoRA adapter's parameters, file keys, signature, rank and scale (none on a
        plain model)."""
        self.is_lora = hasattr(model, "peft_config")
        self.file_keys: dict[str, str] = lora.file_key_map(model) if self.is_lora else {}
        # The adapter's parameters, in model order (the optimizer and its saved state rely on it).
        adapter_names = set(self.file_keys.values())
        self.params: dict[str, nn.Parameter] = {
            n: p for n, p in model.named_parameters() if n in adapter_names
        }
        self.signature = (
            lora.adapter_signature(model.peft_config["default"]) if self.is_lora else None
        )
        config = model.peft_config["default"] if self.is_lora else None
        self.lora_rank = int(config.r) if config is not None else 0
        self.lora_scale = lora.scaling(config) if config is not None else 0.0

    @property
    def max_positions(self) -> int | None:
        config = getattr(self.model, "config", None)
        return getattr(config, "max_position_embeddings", None)

    def snapshot(self) -> AdapterWeights:
        with self.lock, torch.no_grad():
            return self.frozen({n: p.detach().clone() for n, p in self.params.items()})

    def frozen(self, tensors: dict[str, torch.Tensor]) -> AdapterWeights:
        """`tensors` (this host's LoRA parameters by name, copies) as a sampler's adapter."""
        return AdapterWeights(tensors, self.lora_scale, self.lora_rank)

    @contextmanager
    def training(self, adapter: LiveAdapter) -> Iterator[nn.Module]:
        """The model with `adapter`'s tensors and gradients in its LoRA parameters, lock held.
        They stay there after (the next client to work swaps them out), so a host with one
        client never swaps. After the pass, its freed activations go back to the system."""
        try:
            with self.lock:
                if self.active is not adapter:
                    previous = self.active
                    for name, param in self.params.items():
                        if previous is not None:
                            previous.grads[name] = param.grad
                        param.data = adapter.tensors[name]
                        param.grad = adapter.grads[name]
                    self.active = adapter
                yield self.model
        finally:
            heap.give_back_free_memory()

    def acquire(self) -> None:
        with self._users_lock:
            self.users += 1

    def release(self) -> None:
        """One user fewer; the last one's release closes the host (through its owner)."""
        with self._users_lock:
            self.users -= 1
            unused = self.users <= 0
        if unused and self._on_unused is not None:
            self._on_unused(self)

    def adapter_from_file(self, tensors: dict[str, torch.Tensor]) -> AdapterWeights:
        """Adapter tensors as saved by peft, placed on this host's parameters."""
        missing = set(self.file_keys) - set(tensors)
        unknown = set(tensors) - set(self.file_keys)
        if missing or unknown:
            raise ValueError(
                f"adapter does not fit this model: missing {sorted(missing)[:3]}, "
                f"unexpected {sorted(unknown)[:3]}"
            )
        placed = {}
        for key, name in self.file_keys.items():
            param = self.params[name]
            if tuple(tensors[key].shape) != tuple(param.shape):
                raise ValueError(f"adapter tensor {key} has shape {tuple(tensors[key].shape)}")
            placed[name] = tensors[key].to(device=param.device, dtype=param.dtype)
        return self.frozen(placed)

    @contextmanager
    def use(self, adapter: AdapterWeights | None) -> Iterator[lora.LanguageModel]:
        """The model with `adapter` in place (None: the base model alone), lock held."""
        with self.lock:
            if adapter is None:
                if self.is_lora:
                    with self.model.disable_adapter():
                        yield self.model
                else:
                    yield self.model
                return
            # Swapping .data is a pointer change, not a copy; the live tensors come back after.
            live = {n: p.data for n, p in self.params.items()}
            try:
                for name, tensor in adapter.tensors.items():
                    self.params[name].data = tensor
                yield self.model
            finally:
                for name, tensor in live.items():
                    self.params[name].data = tensor

    def leave(self, adapter: LiveAdapter) -> None:
        """`adapter`'s client is gone: its tensors and gradients leave the LoRA parameters
        (which would hold them as long as the host lives), stand-ins of no memory in their place
        until the next client's turn."""
        if self.active is not adapter:
            return  # swapped out already, and never swapped in again: its client is gone
        with self.lock:
            if self.active is not adapter:
                return
            for param in self.params.values():
                param.data = param.data.new_zeros(()).expand(param.shape)
                param.grad = None
            self.active = None

    def on_close(self, closer: Callable[[], None]) -> bool:
        """Run `closer` when the host closes; False (and nothing kept) if it is closed already."""
        with self._closers_lock:
            if self.closed:
                return False
            self._closers.append(closer)
            return True

    def close(self, for_good: bool = False) -> None:
        """End what runs on the host (its closers); `for_good`: nothing may start on it again
        (its owner let it go), else a later use starts afresh."""
        with self._closers_lock:
            self.closed = self.closed or for_good
            closers, self._closers = self._closers, []
        for closer in closers:
            closer()
