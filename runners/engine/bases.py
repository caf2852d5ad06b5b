"""Base models loaded once each and shared: hosts for each LoRA shape on a base (one per
training lane in use, users spread over them), every host on that base built on the same
weight tensors; a memory budget for new bases.

A host is handed out acquired (ModelHost.users); when its last client or sampler releases it,
it is closed, and a base with no host left is forgotten, its weights freed at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runners.engine import heap, lora, onednn_cache
from runners.engine.host import ModelHost, SharedBase

MIB = 1 << 20
Loader = Callable[[str], tuple[nn.Module, Any]]


class ModelRefused(ValueError):
    """Loading one more base model would pass the memory budget."""


@dataclass
class LoadedBase:
    name: str
    model: nn.Module  # as loaded, never wrapped: hosts wrap copies sharing its tensors
    tokenizer: Any
    nbytes: int
    shared: SharedBase  # its lock and its one decode scheduler, whatever the LoRA shape
    # By LoRA signature and training lane (host.py): a shape's hosts share the base's weights.
    hosts: dict[tuple[str | None, int], ModelHost] = field(default_factory=dict)
    forgotten: bool = False  # its last host closed: its weights are freed, a new load serves


class BaseModels:
    def __init__(
        self,
        load: Loader,
        host_options: dict[str, Any],
        budget_bytes: int | None = None,
        estimate: Callable[[str], int | None] | None = None,
        lanes: int = 1,
    ) -> None:
        self._load = load
        self._host_options = host_options
        self._lanes = lanes  # training passes side by side on a base (host.py's SharedBase)
        self._budget = budget_bytes
        self._estimate = estimate or (lambda name: None)
        self._lock = threading.Lock()
        self._loading = threading.Lock()  # one model loads at a time (and is counted once)
        self._bases: dict[str, LoadedBase] = {}

    # Hosts -------------------------------------------------------------------------------

    def lora_host(self, name: str, spec: lora.LoraSpec) -> ModelHost:
        """An acquired host for LoRA adapters of shape `spec` on base model `name`."""
        return self._acquired(name, lambda base: lora.lora_config(base.model, spec, name))

    def host_for_config(self, name: str, config: Any) -> ModelHost:
        """An acquired host for adapters saved with peft LoraConfig `config` on `name`."""
        return self._acquired(name, lambda base: config)

    def bare_host(self, name: str) -> ModelHost:
        """An acquired host of the base model alone (no adapter)."""
        return self._acquired(name, lambda base: None)

    def lanes(self) -> list[dict[str, Any]]:
        """Each loaded base's training lanes: whether a client trains on it now, and how many
        wait for their turn."""
        with self._lock:
            bases = list(self._bases.values())
        return [
            {"base": base.name, "lane": i, "training": lock.held(), "waiting": lock.waiting()}
            for base in bases
            for i, lock in enumerate(base.shared.lanes)
        ]

    def loaded(self) -> list[tuple[str, int, int]]:
        """(name, bytes, users) of each loaded base model."""
        with self._lock:
            return [
                (b.name, b.nbytes, sum(h.users for h in b.hosts.values()))
                for b in self._bases.values()
            ]

    def close(self) -> None:
        with self._lock:
            hosts = [h for b in self._bases.values() for h in b.hosts.values()]
            self._bases.clear()
        for host in hosts:
            host.close(for_good=True)

    def _acquired(self, name: str, config_of: Callable[[LoadedBase], Any]) -> ModelHost:
        """A host of the LoRA config `config_of(base)` on base `name`, loaded again if the base
        was forgotten (its last host closed) while this call reached it."""
        while True:
            base = self._base(name)
            host = self._host(base, config_of(base))
            if host is not None:
                return host

    def _host(self, base: LoadedBase, config: Any) -> ModelHost | None:
        """An acquired host on `base`; None if `base` is forgotten meanwhile."""
        signature = None if config is None else lora.adapter_signature(config)
        with self._lock:
            if base.forgotten:
                return None
            joined = self._joinable(base, signature)
            if joined is not None:
                joined.acquire()
                return joined
            lane = self._free_lane(base, signature)
        if config is None:
            model = base.model
        else:
            # Made outside the lock (a copy of the module tree); the first one made is kept.
            model = lora.wrap_with_config(lora.shared_copy(base.model), config, seed=0)
        with self._lock:
            if base.forgotten:
                return None
            host = base.hosts.get((signature, lane))
            if host is None:
                host = ModelHost(
                    base.name,
                    model,
                    base.tokenizer,
                    shared=base.shared,
                    on_unused=self._unused,
                    lane=lane,
                    **self._host_options,
                )
                base.hosts[(signature, lane)] = host
                self._bases.setdefault(base.name, base)
            host.acquire()
            return host

    @staticmethod
    def _joinable(base: LoadedBase, signature: str | None) -> ModelHost | None:
        """The least used host of this LoRA shape, unless a lane of the base has none of this
        shape yet while each one it has is in use (the base model alone keeps to one lane)."""
        hosts = [h for (s, _), h in base.hosts.items() if s == signature]
        least = min(hosts, key=lambda h: h.users, default=None)
        lanes = 1 if signature is None else len(base.shared.lanes)
        if least is not None and (least.users == 0 or len(hosts) >= lanes):
            return least
        return None

    @staticmethod
    def _free_lane(base: LoadedBase, signature: str | None) -> int:
        """The least used lane with no host of this LoRA shape, for a new one."""
        lanes = 1 if signature is None else len(base.shared.lanes)
        taken = {lane for (s, lane) in base.hosts if s == signature}
        load = [0] * len(base.shared.lanes)
        for host in base.hosts.values():
            load[host.lane] += host.users
        return min((lane for lane in range(lanes) if lane not in taken), key=load.__getitem__)

    def _unused(self, host: ModelHost) -> None:
        """`host`'s last user left: it closes (its lane's copy of the module tree goes), and
        with the base's last host, the base."""
        forgotten = None
        with self._lock:
            if host.users > 0:
                return  # acquired again meanwhile
            base = self._bases.get(host.base_model)
            if base is not None:
                for key, known in list(base.hosts.items()):
                    if known is host:
                        del base.hosts[key]
                if not base.hosts:
                    del self._bases[base.name]
                    base.forgotten = True
                    forgotten = base
        host.close(for_good=True)  # its decode scheduler too, with the base's last host
        if forgotten is not None:
            free_weights(forgotten.model)
            onednn_cache.empty()  # the products compiled for its shapes
        heap.give_back_free_memory()

    # Bases -------------------------------------------------------------------------------

    def _base(self, name: str) -> LoadedBase:
        with self._loading:
            with self._lock:
                found = self._bases.get(name)
            if found is not None:
                return found
            self._check_budget(name, self._estimate(name))
            model, tokenizer = self._load(name)
            shared = SharedBase(name, self._lanes)
            base = LoadedBase(name, model, tokenizer, model_bytes(model), shared)
            try:
                self._check_budget(name, base.nbytes)
            except ModelRefused:
                del model, base
                raise
            with self._lock:
                # Registered with its first host; until then another call finds it here.
                self._bases[name] = base
            return base

    def _check_budget(self, name: str, needed: int | None) -> None:
        if self._budget is None or needed is None:
            return
        loaded = self.loaded()
        in_use = sum(nbytes for _, nbytes, _ in loaded)
        if in_use + needed <= self._budget:
            return
        held = (
            ", ".join(f"{n} ({b / MIB:.0f} MiB, {u} client(s))" for n, b, u in loaded) or "nothing"
        )
        raise ModelRefused(
            f"loading {name} ({needed / MIB:.0f} MiB) would pass the memory budget of "
            f"{self._budget / MIB:.0f} MiB (this engine host's share of "
            f"RLCS_ENGINE_MEMORY_BUDGET_GB); loaded now: {held}. Finish the sessions using "
            "another model, use a loaded one, or raise the budget."
        )


def free_weights(model: nn.Module) -> None:
    """Empty every parameter and buffer of a forgotten base. Its hosts share these very
    tensors, and a closed client or sampler (still held by its caller for a while) holds its
    host: emptied here, the weights go now rather than with the last of those."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.new_empty(0)


def model_bytes(model: nn.Module) -> int:
    """Bytes held by a model's parameters and buffers, each storage counted once (tied
    embeddings share one)."""
    seen: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def weight_files_bytes(folder: Path) -> int | None:
    """Size of a model folder's weight files: a lower bound of its memory, before loading."""
    files = [*folder.glob("*.safetensors"), *folder.glob("*.bin")]
    return sum(f.stat().st_size for f in files) if files else None
