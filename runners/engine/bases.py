"""Base models loaded once each and shared: one host per LoRA shape on a base, every host on
that base built on the same weight tensors (and lock); a memory budget for new bases.

A host is handed out acquired (ModelHost.users); when its last client or sampler releases it,
it is closed, and a base with no host left is forgotten, its memory freed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from runners.engine import lora
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
    hosts: dict[str | None, ModelHost] = field(default_factory=dict)  # by LoRA signature


class BaseModels:
    def __init__(
        self,
        load: Loader,
        host_options: dict[str, Any],
        budget_bytes: int | None = None,
        estimate: Callable[[str], int | None] | None = None,
    ) -> None:
        self._load = load
        self._host_options = host_options
        self._budget = budget_bytes
        self._estimate = estimate or (lambda name: None)
        self._lock = threading.Lock()
        self._loading = threading.Lock()  # one model loads at a time (and is counted once)
        self._bases: dict[str, LoadedBase] = {}

    # Hosts -------------------------------------------------------------------------------

    def lora_host(self, name: str, spec: lora.LoraSpec) -> ModelHost:
        """An acquired host for LoRA adapters of shape `spec` on base model `name`."""
        base = self._base(name)
        return self._host(base, lora.lora_config(base.model, spec, name))

    def host_for_config(self, name: str, config: Any) -> ModelHost:
        """An acquired host for adapters saved with peft LoraConfig `config` on `name`."""
        return self._host(self._base(name), config)

    def bare_host(self, name: str) -> ModelHost:
        """An acquired host of the base model alone (no adapter)."""
        return self._host(self._base(name), None)

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
            host.close()

    def _host(self, base: LoadedBase, config: Any) -> ModelHost:
        signature = None if config is None else lora.adapter_signature(config)
        with self._lock:
            host = base.hosts.get(signature)
            if host is not None:
                host.acquire()
                return host
        if config is None:
            model = base.model
        else:
            # Made outside the lock (a copy of the module tree); the first one made is kept.
            model = lora.wrap_with_config(lora.shared_copy(base.model), config, seed=0)
        with self._lock:
            host = base.hosts.get(signature)
            if host is None:
                host = ModelHost(
                    base.name,
                    model,
                    base.tokenizer,
                    shared=base.shared,
                    on_unused=self._unused,
                    **self._host_options,
                )
                base.hosts[signature] = host
                self._bases.setdefault(base.name, base)
            host.acquire()
            return host

    def _unused(self, host: ModelHost) -> None:
        with self._lock:
            if host.users > 0:
                return  # acquired again meanwhile
            base = self._bases.get(host.base_model)
            if base is not None:
                for signature, known in list(base.hosts.items()):
                    if known is host:
                        del base.hosts[signature]
                if not base.hosts:
                    del self._bases[base.name]
        host.close()

    # Bases -------------------------------------------------------------------------------

    def _base(self, name: str) -> LoadedBase:
        with self._loading:
            with self._lock:
                found = self._bases.get(name)
            if found is not None:
                return found
            self._check_budget(name, self._estimate(name))
            model, tokenizer = self._load(name)
            base = LoadedBase(name, model, tokenizer, model_bytes(model), SharedBase(name))
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
            f"{self._budget / MIB:.0f} MiB (RLCS_TINKER_MEMORY_BUDGET_GB); loaded now: {held}. "
            "Finish the sessions using another model, use a loaded one, or raise the budget."
        )


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
