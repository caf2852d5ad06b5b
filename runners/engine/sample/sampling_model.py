"""The decode scheduler's own copy of a model: plain modules in the sampling dtype, where each
LoRA layer is the frozen base layer plus a low-rank update held in buffers.

Loading an adapter is a `copy_` into those buffers (no new tensors, so captured CUDA graphs stay
valid). The base weights are shared with the trainer's model when the dtypes match (LoRA never
changes them), so sampling needs neither the trainer's lock nor a second copy; otherwise they
are copied once, cast. The update is applied unmerged: merged into bf16 weights, updates below
bf16's precision would round away and the sampler would lag the trainer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from runners.engine.host import AdapterWeights, ModelHost
from runners.engine.lora import LanguageModel
from runners.engine.sample.decode_attention import use_grouped_decode
from runners.models.loading import refuse_float16_off_cuda

_PEFT_PREFIX = "base_model.model."


def resolve_sampling_dtype(
    requested: str, model_dtype: torch.dtype, device: torch.device
) -> torch.dtype:
    """`auto`: bfloat16 on a CPU with native bf16 matmuls (weight reads dominate decoding
    there: 2.5-3x faster than float32 for SmolLM2), else the model's own dtype (on CUDA an
    fp16 trainer's sampler is fp16 too). float16 is a CUDA option only."""
    refuse_float16_off_cuda(requested, device, "sampling_dtype (RLCS_SAMPLING_DTYPE)")
    if requested != "auto":
        return getattr(torch, requested)
    if device.type == "cpu" and model_dtype == torch.float32 and _cpu_has_fast_bf16():
        return torch.bfloat16
    return model_dtype


def _cpu_has_fast_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class LoraDelta(nn.Module):
    """`base(x) + up(down(x))`, with `up` already scaled by alpha / rank; zero `up`: base alone."""

    down: torch.Tensor  # buffers (register_buffer below), declared for the type checker
    up: torch.Tensor

    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base
        weight = base.weight
        self.register_buffer("down", weight.new_zeros(rank, base.in_features))
        self.register_buffer("up", weight.new_zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.down), self.up)


@dataclass(frozen=True)
class _Slot:
    module: LoraDelta
    down_name: str  # the trainer's parameter names, as AdapterWeights keys them
    up_name: str
    scale: float


class SamplingModel:
    """A host's model for sampling, with one adapter slot: `load(0, adapter)` puts an adapter
    (or none) in place; rows of another adapter wait until this one's drain."""

    slots = 1  # the adapter lives in the layers' own buffers: one at a time

    def __init__(self, host: ModelHost, dtype: torch.dtype) -> None:
        source = host.model.get_base_model() if host.is_lora else host.model
        adapter = {id(p) for p in host.params.values()}
        shared = all(p.dtype == dtype for p in source.parameters() if id(p) not in adapter)
        # Sharing: deepcopy reuses every tensor found in the memo instead of copying it.
        memo = {id(t): t for t in [*source.parameters(), *source.buffers()]} if shared else {}
        with torch.no_grad():
            module = copy.deepcopy(source, memo)
        # Nothing here may change a shared tensor's flags (requires_grad_ would freeze the
        # trainer's LoRA parameters too); sampling runs under no_grad instead.
        self.lora = _replace_lora_layers(host, module)
        if not shared:
            _cast_weights(module, dtype)
        use_grouped_decode(module)  # the copy's config is its own: the trainer keeps sdpa
        self.module = module.eval()
        self.dtype = dtype
        self.shares_weights = shared
        # The id of the adapter loaded (0: the base model, -1: nothing yet), not the adapter:
        # that would keep a closed sampler's tensors.
        self._loaded = -1

    def load(self, slot: int, adapter: AdapterWeights | None) -> None:
        if slot != 0:
            raise ValueError(f"slot {slot}: this sampling copy holds one adapter, in slot 0")
        key = 0 if adapter is None else adapter.id
        if key == self._loaded:
            return
        with torch.no_grad():
            for lora in self.lora:
                if adapter is None:
                    lora.module.up.zero_()
                    continue
                lora.module.down.copy_(adapter.tensors[lora.down_name])
                lora.module.up.copy_(adapter.tensors[lora.up_name] * lora.scale)
        self._loaded = key

    def score(self, ids: list[int], slot: int) -> torch.Tensor:
        """The logits [len(ids), vocab] at every position of `ids` with the loaded adapter."""
        with torch.no_grad():
            batch = torch.tensor([ids], device=next(self.module.parameters()).device)
            return self.module(input_ids=batch).logits[0]


def plain_head(config: object) -> bool:
    """The logits are the unembedding of the hidden state, nothing after (no soft-capping
    or scaling), so it may be applied to chosen rows alone."""
    return not (
        getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None)
    )


def next_token_logits(
    model: LanguageModel,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    cache: object,
    last: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits [rows, vocab] at each row's last position (`last`: per-row indices, else the
    final column), the unembedding applied to those hidden states only."""
    if not plain_head(model.config):
        # Models that post-process logits keep their own head (the final column only).
        assert last is None, "per-row last positions need a plain unembedding"
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :]
    hidden = model.get_decoder()(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    picked = hidden[:, -1] if last is None else hidden[torch.arange(len(last)), last]
    # Contiguous on purpose: a strided [rows, 1, hidden] slice sends torch's matmul down a
    # batched path that copies the unembedding once per row (1 s per prefill for SmolLM2).
    return model.get_output_embeddings()(picked.contiguous())


def _cast_weights(module: nn.Module, dtype: torch.dtype) -> None:
    """Parameters and LoRA buffers to `dtype`; other buffers (rotary frequencies) keep theirs,
    as the trainer's do."""
    with torch.no_grad():
        for param in module.parameters():
            param.data = param.data.to(dtype)
        for delta in module.modules():
            if isinstance(delta, LoraDelta):
                delta.down, delta.up = delta.down.to(dtype), delta.up.to(dtype)


def _replace_lora_layers(host: ModelHost, module: nn.Module) -> list[_Slot]:
    """Swap each peft LoRA layer in `module` (a copy) for a LoraDelta on its base layer."""
    if not host.is_lora:
        return []
    from peft.tuners.lora import LoraLayer

    names = {id(p): n for n, p in host.params.items()}
    slots = []
    for name, layer in host.model.named_modules():
        if not isinstance(layer, LoraLayer) or "default" not in layer.lora_A:
            continue
        relative = name.removeprefix(_PEFT_PREFIX)
        copied = module.get_submodule(relative)
        parent_name, _, leaf = relative.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        base = copied.base_layer
        assert isinstance(base, nn.Linear)  # LoRA targets linear layers only (target_modules)
        delta = LoraDelta(base, int(layer.r["default"]))
        setattr(parent, leaf, delta)
        slots.append(
            _Slot(
                delta,
                names[id(layer.lora_A["default"].weight)],
                names[id(layer.lora_B["default"].weight)],
                float(layer.scaling["default"]),
            )
        )
    return slots
