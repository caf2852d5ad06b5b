"""The default training micro-batch budget (padded tokens per forward/backward pass), chosen
from the device and the model's shape: 4096 on the CPU and small GPUs, more where it fits.

Pure functions of (device type, total device memory, model shape), so the rule is tested on
the CPU; `model_shape` and `device_memory_bytes` read those from a loaded model and device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# The budget everywhere the device says nothing better: the CPU (micro-batches of more tokens
# gain nothing there) and GPUs whose memory does not hold 2x more activations.
SMALL_BUDGET = 4096
# Largest default: the largest budget measured (benchmarks/README.md, "On a GPU").
MAX_BUDGET = 32768
# Share of the device's memory the activations of one micro-batch may take. The rest holds
# the weights, the optimizer state, the sampler's bf16 copy and KV slots, and a second run on
# the same GPU (RLCS_MAX_CONCURRENT_RUNS is 2 by default), each with budgets of its own.
ACTIVATION_SHARE = 1 / 3


@dataclass(frozen=True)
class ModelShape:
    """What a decoder's activation memory per token depends on."""

    layers: int
    hidden: int
    intermediate: int
    kv_dim: int  # key/value heads x head size
    element_bytes: int  # 2 for a bf16 (or fp16) base, 4 for float32

    def activation_bytes_per_token(self) -> int:
        """Bytes autograd keeps per token for the backward pass of a LoRA step. Counted with
        saved-tensor hooks on a bf16 base, fp32 LoRA on every linear layer, bf16 autocast:
        per layer about 8 hidden-sized tensors (two RMSNorms' inputs and outputs, the
        attention's query and output, the output projection's input), 4 intermediate-sized
        ones (gate, up, their activation and product) and 2 key/value-sized ones.
        SmolLM2-135M's shape: 668 KB by this count; 673 KB counted on the CPU, 677 KB of
        peak CUDA memory per token on an H200. Qwen2-1.5B's: 2.72 MB; 2.75 MB on the H200."""
        per_layer = 8 * self.hidden + 4 * self.intermediate + 2 * self.kv_dim
        return self.layers * per_layer * self.element_bytes


def default_tokens_per_microbatch(
    device_type: str, total_memory_bytes: int | None, shape: ModelShape | None
) -> int:
    """The largest power of two from SMALL_BUDGET to MAX_BUDGET whose activations fit in
    ACTIVATION_SHARE of the device's memory; SMALL_BUDGET off CUDA or when a figure is missing.

    Why larger (H200, benchmarks/README.md): a 1.5B LoRA step ran at 22.3k tok/s with
    4096-token micro-batches, 29.4k at 8192, 33.6k at 16384 (26.3% of the bf16 matrix rate,
    peak 47.6 GiB), 34.3k at 32768 (89.6 GiB); at 135M 21.7k up to 93.9k tok/s at 32768 (22.2
    GiB): small micro-batches leave the GPU waiting on Python's launches of the LoRA layers.
    An H200 (140 GiB) gets 16384 at 1.5B and 32768 at 135M; an 80 GB H100 8192 at 1.5B; a
    24 GB GPU 4096."""
    if device_type != "cuda" or not total_memory_bytes or shape is None:
        return SMALL_BUDGET
    room = total_memory_bytes * ACTIVATION_SHARE
    per_token = shape.activation_bytes_per_token()
    budget = SMALL_BUDGET
    while budget * 2 <= MAX_BUDGET and budget * 2 * per_token <= room:
        budget *= 2
    return budget


def model_shape(config: Any, dtype: torch.dtype) -> ModelShape | None:
    """A transformers config's shape; None where it lacks the fields (an unusual model)."""
    try:
        hidden = int(config.hidden_size)
        layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
    except (AttributeError, TypeError):
        return None
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    return ModelShape(
        layers=layers,
        hidden=hidden,
        intermediate=int(intermediate),
        kv_dim=int(kv_heads) * int(head_dim),
        element_bytes=torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4,
    )


def device_memory_bytes(device: torch.device) -> int | None:
    """Total memory of a CUDA device; None for any other."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)
