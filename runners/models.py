"""Resolve a model name to weights and a tokenizer with no download at run time.

Names: `tiny-random` (built in-process), SmolLM2-135M-Instruct (from the packaged GGUF), a
local Hugging Face folder, or a hub id that is cached locally or reachable. Heavy imports
happen inside functions so the API server can call the cheap checks without loading torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runners import smollm2_gguf
from runners.smollm2_gguf import SMOLLM2

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

TINY_RANDOM = "tiny-random"
DEFAULT_MODEL = SMOLLM2
__all__ = [
    "DEFAULT_MODEL",
    "SMOLLM2",
    "TINY_RANDOM",
    "ModelNotAvailable",
    "known_models",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "model_available",
    "resolve_device",
    "resolve_dtype",
    "validate_device_dtype",
]

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
HUB_PROBE_TIMEOUT_S = 5.0


class ModelNotAvailable(ValueError):
    """The model name cannot be resolved on this machine (offline, not cached, not a folder)."""


def known_models() -> list[str]:
    """Names that resolve offline right now."""
    names = [TINY_RANDOM]
    if smollm2_gguf.find_gguf() is not None:
        names.append(SMOLLM2)
    return names


def _not_available_message(name: str, why: str) -> str:
    return (
        f"model {name!r} cannot be resolved offline: {why}. Usable here: "
        f"{', '.join(known_models())}, a local folder with a Hugging Face model, or a hub id "
        f"that is in the local Hugging Face cache (or reachable over the network)"
    )


def validate_device_dtype(device: str, dtype: str) -> None:
    """Reject bad spellings without importing torch (for config validation)."""
    if not isinstance(device, str) or not _DEVICE_RE.match(device):
        raise ValueError(f"device must be one of 'auto', 'cpu', 'cuda', 'cuda:N'; got {device!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}; got {dtype!r}")


def resolve_device(device: str = "auto") -> torch.device:
    """`auto` picks CUDA when available, else CPU; asking for missing CUDA is an error."""
    import torch

    validate_device_dtype(device, "auto")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available here")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on CUDA and float32 on CPU (CPU bfloat16 matmuls are slow)."""
    import torch

    validate_device_dtype("auto", dtype)
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~"))


def _local_folder(name: str) -> Path | None:
    path = Path(name).expanduser()
    return path if path.is_dir() else None


def _hub_cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # invalid repo ids raise here; they are simply not cached
        return False
    return isinstance(found, str)


def _probe_hub(name: str) -> str | None:
    """None when the hub answers for this model, else why not (fast: one short request)."""
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        return "the Hugging Face Hub is switched off (HF_HUB_OFFLINE) and it is not cached"
    try:
        HfApi().model_info(name, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception as exc:
        return f"it is not in the local Hugging Face cache and the hub did not answer ({exc})"
    return None


def model_available(
    name: str, models_dir: Path | None = None, *, check_hub: bool = True
) -> tuple[bool, str]:
    """Whether `name` can be loaded here, and how (or why not); never loads weights."""
    if name == TINY_RANDOM:
        return True, "built in-process (no download)"
    if name == SMOLLM2:
        if models_dir is not None and smollm2_gguf.is_converted(models_dir):
            return True, f"converted copy in {smollm2_gguf.converted_dir(models_dir)}"
        if smollm2_gguf.find_gguf() is not None:
            return True, f"from the GGUF packaged in {smollm2_gguf.DISTRIBUTION}"
    folder = _local_folder(name)
    if folder is not None:
        if (folder / "config.json").is_file():
            return True, f"local folder {folder}"
        return False, f"folder {folder} has no config.json (not a Hugging Face model folder)"
    if _looks_like_path(name):
        return False, _not_available_message(name, "there is no such folder")
    if not _HUB_ID_RE.match(name):
        return False, _not_available_message(name, "it is neither a known name nor a hub id")
    if _hub_cached(name):
        return True, "in the local Hugging Face cache"
    if not check_hub:
        return False, _not_available_message(name, "it is not in the local Hugging Face cache")
    why = _probe_hub(name)
    if why is None:
        return True, "will be downloaded from the Hugging Face Hub"
    return False, _not_available_message(name, why)


def load_tokenizer(name: str, models_dir: Path) -> Any:
    """The tokenizer alone (no weights)."""
    from transformers import AutoTokenizer

    if name == TINY_RANDOM:
        from runners.tiny_model import build_tiny_tokenizer

        return build_tiny_tokenizer()
    if name == SMOLLM2:
        if smollm2_gguf.is_converted(models_dir):
            return AutoTokenizer.from_pretrained(smollm2_gguf.converted_dir(models_dir))
        gguf = smollm2_gguf.find_gguf()
        if gguf is not None:
            return smollm2_gguf.load_gguf_tokenizer(gguf)
    return _from_folder_or_hub(name, AutoTokenizer.from_pretrained)


def load_model_and_tokenizer(
    name: str, models_dir: Path, device: str = "auto", dtype: str = "auto"
) -> tuple[PreTrainedModel, Any]:
    """The model (eval mode, on its device, in its dtype) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    if name == TINY_RANDOM:
        from runners.tiny_model import build_tiny

        model, tokenizer = build_tiny()
    else:
        source = name
        if name == SMOLLM2 and (
            smollm2_gguf.is_converted(models_dir) or smollm2_gguf.find_gguf() is not None
        ):
            source = str(smollm2_gguf.ensure_converted(models_dir))
        tokenizer = _from_folder_or_hub(source, AutoTokenizer.from_pretrained, shown=name)
        model = _from_folder_or_hub(
            source,
            lambda src, **kw: AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype, **kw),
            shown=name,
        )
    if tokenizer.pad_token_id is None:
        # Batched sampling pads; any id works since padded positions are masked out.
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device=torch_device, dtype=torch_dtype).eval()
    return model, tokenizer


def _from_folder_or_hub(name: str, loader: Any, shown: str | None = None) -> Any:
    """Load from a folder or the HF cache first; the network only after a quick probe.

    transformers alone retries an unreachable hub for about half a minute per file.
    """
    shown = shown or name
    folder = _local_folder(name)
    if folder is not None:
        if not (folder / "config.json").is_file() and not (folder / "tokenizer.json").is_file():
            raise ModelNotAvailable(_not_available_message(shown, f"{folder} is not a model"))
        return loader(str(folder))
    if _looks_like_path(name):
        raise ModelNotAvailable(_not_available_message(shown, "there is no such folder"))
    if not _HUB_ID_RE.match(name):
        raise ModelNotAvailable(
            _not_available_message(shown, "it is neither a known name nor a hub id")
        )
    try:
        return loader(name, local_files_only=True)
    except OSError:
        pass
    why = _probe_hub(name)
    if why is not None:
        raise ModelNotAvailable(_not_available_message(shown, why))
    return loader(name)
