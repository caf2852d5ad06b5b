"""Load a model and its tokenizer by name with no download at run time (torch lives here).

Which names resolve, and the defaults, are torch-free facts in `core.model_names`.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.model_names import (
    SMOLLM2,
    TINY_RANDOM,
    ModelNotAvailable,
    find_smollm2_gguf,
    is_hub_id,
    local_folder,
    looks_like_path,
    not_available_message,
    probe_hub,
    smollm2_converted_dir,
    smollm2_is_converted,
    validate_device_dtype,
)
from runners.models import smollm2_gguf
from runners.models.tokenizer_files import make_portable

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


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
    """`auto` is bfloat16 on CUDA and float32 on CPU (CPU bfloat16 matmuls are slow);
    float16 is refused off CUDA (`refuse_float16_off_cuda`)."""
    import torch

    validate_device_dtype("auto", dtype)
    refuse_float16_off_cuda(dtype, device, "dtype (RLCS_DTYPE)")
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def refuse_float16_off_cuda(dtype: str, device: torch.device, setting: str) -> None:
    """float16 is a CUDA option (fp16 autocast and loss scaling for the trainer, an fp16
    sampling copy): a CPU has no fp16 fast path here, so it would only be a silent slow path."""
    if dtype == "float16" and device.type != "cuda":
        raise ValueError(
            f"{setting} float16 is a CUDA option (training under fp16 autocast with loss "
            f"scaling, sampling in fp16); the device here is {device}: use float32 or bfloat16"
        )


def load_tokenizer(name: str, models_dir: Path) -> Any:
    """The tokenizer alone (no weights)."""
    from transformers import AutoTokenizer

    if name == TINY_RANDOM:
        from runners.models.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer()
    if name == SMOLLM2:
        if smollm2_is_converted(models_dir):
            return AutoTokenizer.from_pretrained(smollm2_converted_dir(models_dir))
        gguf = find_smollm2_gguf()
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
        from runners.models.tiny import build_tiny

        model, tokenizer = build_tiny()
    else:
        source = name
        if name == SMOLLM2 and (
            smollm2_is_converted(models_dir) or find_smollm2_gguf() is not None
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
    # transformers wraps PreTrainedModel.to in functools.wraps(nn.Module.to), which types it
    # as the unbound method (self missing); the call is the bound one.
    model = model.to(device=torch_device, dtype=torch_dtype).eval()  # type: ignore[call-arg]
    return model, tokenizer


def weights_folder(name: str, models_dir: Path) -> Path | None:
    """The folder `name`'s weights load from, when it is on disk already (nothing converted
    or downloaded): for sizing a model before loading it."""
    if name == SMOLLM2:
        converted = smollm2_converted_dir(models_dir)
        return converted if smollm2_is_converted(models_dir) else None
    return local_folder(name)


def _from_folder_or_hub(name: str, loader: Any, shown: str | None = None) -> Any:
    """Load from a folder or the HF cache first; the network only after a quick probe.

    transformers alone retries an unreachable hub for about half a minute per file.
    """
    shown = shown or name
    folder = local_folder(name)
    if folder is not None:
        if not (folder / "config.json").is_file() and not (folder / "tokenizer.json").is_file():
            raise ModelNotAvailable(not_available_message(shown, f"{folder} is not a model"))
        return loader(str(folder))
    if looks_like_path(name):
        raise ModelNotAvailable(not_available_message(shown, "there is no such folder"))
    if not is_hub_id(name):
        raise ModelNotAvailable(
            not_available_message(shown, "it is neither a known name nor a hub id")
        )
    try:
        return loader(name, local_files_only=True)
    except OSError:
        pass
    why = probe_hub(name)
    if why is not None:
        raise ModelNotAvailable(not_available_message(shown, why))
    return loader(name)


def tokenizer_folder(name: str, models_dir: Path) -> str:
    """What `AutoTokenizer.from_pretrained` loads offline for `name`, for processes that load
    the tokenizer themselves (a script written for Tinker, an Atropos environment): the
    converted SmolLM2 folder, tiny-random's tokenizer written once into the models folder, a
    local folder as given, or a hub id as given (cached or reachable, else loading says why)."""
    if name == SMOLLM2:
        if smollm2_is_converted(models_dir) or find_smollm2_gguf() is not None:
            return str(smollm2_gguf.ensure_converted(models_dir))
        return name
    if name == TINY_RANDOM:
        folder = Path(models_dir) / "tiny-random-tokenizer"
        if not (folder / "tokenizer_config.json").is_file():
            from runners.models.tiny import build_tiny_tokenizer

            # Written beside and renamed in, so a reader never sees half a folder (a folder of
            # its own per writer: threads of one process may write it at once).
            folder.parent.mkdir(parents=True, exist_ok=True)
            partial = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{folder.name}.partial-"))
            build_tiny_tokenizer().save_pretrained(partial)
            make_portable(partial)
            try:
                partial.rename(folder)
            except OSError:  # another process renamed its copy in first
                shutil.rmtree(partial, ignore_errors=True)
        make_portable(folder)  # one written before the tokenizer config was portable
        return str(folder)
    found = local_folder(name)
    return str(found) if found is not None else name
