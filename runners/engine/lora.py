"""LoRA with peft: which linear layers get an adapter, seeded init, and adapter files on disk.

Adapter files use the standard peft layout (adapter_model.safetensors + adapter_config.json),
so `peft.PeftModel.from_pretrained(base, folder)` loads what this backend saves.
"""

from __future__ import annotations

import copy
import json
import math
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

# A transformers causal LM, or peft's wrapper of one. Held untyped on purpose: peft forwards
# every attribute to the model it wraps (its __getattr__ returns Any), transformers leaves
# get_decoder and get_output_embeddings unannotated, and nn.Module would type each such
# attribute as a tensor or a submodule.
LanguageModel = Any

# Fixed like the hosted service's (it exposes only the rank); scaling is alpha / rank.
LORA_ALPHA = 32
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"

_ATTN_HINTS = ("attn", "attention")
_MLP_HINTS = ("mlp", "feed_forward", "ffn")


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True
    alpha: int = LORA_ALPHA

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank must be a positive integer, got {self.rank!r}")
        if not (self.train_mlp or self.train_attn or self.train_unembed):
            raise ValueError("at least one of train_mlp, train_attn, train_unembed must be true")


def _category(model: LanguageModel, name: str, module: nn.Module) -> str | None:
    if module is model.get_output_embeddings():
        return "unembed"
    parent = name.rsplit(".", 1)[0].lower() if "." in name else ""
    if any(hint in parent for hint in _ATTN_HINTS):
        return "attn"
    if any(hint in parent for hint in _MLP_HINTS):
        return "mlp"
    return None


def target_modules(model: LanguageModel, spec: LoraSpec) -> list[str]:
    """Names for peft's target_modules: attention and/or MLP projections, and the unembedding."""
    wanted = {"attn": spec.train_attn, "mlp": spec.train_mlp, "unembed": spec.train_unembed}
    chosen: dict[str, str] = {}
    leaves_by_choice: dict[str, set[bool]] = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        category = _category(model, name, module)
        pick = category is not None and wanted[category]
        leaf = name.rsplit(".", 1)[-1]
        leaves_by_choice.setdefault(leaf, set()).add(pick)
        if pick:
            chosen[name] = leaf
    if not chosen:
        raise ValueError("no linear layer of this model matches the requested LoRA targets")
    # Leaf names ("q_proj") keep adapter_config.json portable; fall back to full names when a
    # leaf name is shared by a chosen and an unchosen layer (it would match both).
    if all(len(leaves_by_choice[leaf]) == 1 for leaf in chosen.values()):
        return sorted(set(chosen.values()))
    return sorted(chosen)


def lora_config(model: LanguageModel, spec: LoraSpec, base_model: str) -> Any:
    """The peft LoraConfig `spec` asks for on `model` (which layers, rank, alpha)."""
    from peft import LoraConfig

    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=0.0,
        bias="none",
        target_modules=target_modules(model, spec),
        base_model_name_or_path=base_model,
    )


def shared_copy(model: LanguageModel) -> LanguageModel:
    """A copy of the module tree that shares every parameter and buffer with `model`: wrapping
    it in LoRA layers leaves `model` as it was, and the weights exist once."""
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    with torch.no_grad():
        return copy.deepcopy(model, memo)


def init_tensors(params: dict[str, nn.Parameter], seed: int | None) -> dict[str, torch.Tensor]:
    """A fresh adapter for the LoRA parameters `params` (peft's init: A kaiming-uniform, B zero,
    so the adapter starts as the base model), drawn from `seed` alone: the same seed gives the
    same adapter whichever host, or how many clients, it lives on."""
    if seed is None:
        seed = random.SystemRandom().randrange(2**63)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, param in params.items():
        tensor = torch.zeros(param.shape, dtype=param.dtype)
        if ".lora_A." in name:
            torch.nn.init.kaiming_uniform_(tensor, a=math.sqrt(5), generator=generator)
        elif ".lora_B." not in name:
            raise ValueError(f"{name} is not a LoRA A or B parameter")
        tensors[name] = tensor.to(param.device)
    return tensors


def wrap_with_config(model: LanguageModel, config: Any, seed: int | None) -> LanguageModel:
    """get_peft_model under a private RNG stream seeded with `seed` (random when None)."""
    from peft import get_peft_model

    if seed is None:
        seed = random.SystemRandom().randrange(2**63)
    # peft records the model's name_or_path in adapter_config.json; make it our model name.
    model.name_or_path = config.base_model_name_or_path
    with warnings.catch_warnings():
        # Tied embeddings: only the unembedding side is adapted, on purpose (no weight tying).
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        # peft draws the init on CPU before moving it to the base layer's device.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return get_peft_model(model, config)


def file_key_map(peft_model: LanguageModel) -> dict[str, str]:
    """Adapter file key (as peft saves it) -> parameter name in this peft model.

    Matched by storage, so it holds whatever naming peft uses (adapter name, prefixes).
    """
    from peft import get_peft_model_state_dict

    by_ptr = {p.data_ptr(): n for n, p in peft_model.named_parameters()}
    saved = get_peft_model_state_dict(peft_model, save_embedding_layers=False)
    return {key: by_ptr[t.data_ptr()] for key, t in saved.items() if t.data_ptr() in by_ptr}


def save_adapter(
    peft_model: LanguageModel, folder: Path, tensors_by_param: dict[str, torch.Tensor]
) -> None:
    """Write adapter weights (never the base model) and adapter_config.json into `folder`."""
    from safetensors.torch import save_file

    key_map = file_key_map(peft_model)
    state = {
        key: tensors_by_param[name].detach().cpu().contiguous() for key, name in key_map.items()
    }
    save_file(state, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    peft_model.peft_config["default"].save_pretrained(str(folder))


def load_adapter(folder: Path) -> tuple[dict[str, torch.Tensor], Any]:
    """Adapter tensors keyed as in the file, and the saved peft LoraConfig."""
    from peft import LoraConfig
    from safetensors.torch import load_file

    if not (folder / ADAPTER_CONFIG).is_file() or not (folder / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(
            f"{folder} holds no peft adapter ({ADAPTER_WEIGHTS} + {ADAPTER_CONFIG})"
        )
    return load_file(str(folder / ADAPTER_WEIGHTS)), LoraConfig.from_pretrained(str(folder))


def adapter_signature(config) -> str:
    """What must match for an adapter file to be applied to an already-wrapped model."""
    targets = config.target_modules
    targets = sorted(targets) if isinstance(targets, list | set | tuple) else targets
    return json.dumps([config.r, config.lora_alpha, targets, bool(config.use_rslora)])


def scaling(config: Any) -> float:
    """The factor peft multiplies an adapter's update by: alpha / rank (alpha / sqrt(rank)
    with rsLoRA)."""
    rank = int(config.r)
    return config.lora_alpha / (math.sqrt(rank) if config.use_rslora else rank)
