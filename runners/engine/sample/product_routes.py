"""Which route each of the packed model's products takes on a device: the adapters masked or
apart, the base products through oneDNN, the adapter updates through the fused CPU kernel. The
decision is made here, once, and handed to `PackedModel`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runners.engine.sample.cpu_products import uses_onednn


@dataclass(frozen=True)
class Routes:
    """The packed model's product routes (packed_group.py has each)."""

    masked: bool  # every slot's A rows under the base weight, a mask per row (capturable)
    onednn: bool  # base products on weights packed once for oneDNN (never with `masked`)
    kernel: bool  # a bf16 copy's adapter updates through the fused kernel, where it builds


def routes_for(
    device: torch.device,
    dtype: torch.dtype,
    *,
    kernel: bool,
    masked: bool | None = None,
    onednn: bool | None = None,
) -> Routes:
    """The routes on `device` for a `dtype` copy. `kernel`: the fused CPU adapter kernel is
    wanted (the host's `cpu_adapter_kernel`); it serves a bf16 copy on the CPU, apart only.
    `masked`: None, on CUDA (its captured graphs need a step of fixed shape). `onednn`: None,
    where `uses_onednn`; the masked route keeps its plain weights."""
    masked = device.type == "cuda" if masked is None else masked
    wants_onednn = uses_onednn(device, dtype) if onednn is None else onednn
    bf16_cpu = device.type == "cpu" and dtype == torch.bfloat16 and not masked
    return Routes(masked=masked, onednn=wants_onednn and not masked, kernel=bf16_cpu and kernel)
