"""Export a local sampler checkpoint as a Hugging Face folder: the PEFT adapter with its
tokenizer and a model card, or (merged) the base model with the adapter folded in."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from core.checkpoint_manifest import MANIFEST_FILE
from core.model_names import SMOLLM2, local_folder, smollm2_converted_dir, smollm2_is_converted
from runners.engine import checkpoints as ckpt
from runners.engine.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from runners.export.model_card import model_card
from runners.models.loading import load_model_and_tokenizer, load_tokenizer


def base_location(base_model: str, models_dir: Path) -> str | None:
    """The folder the base model's weights are read from here, when it is a local one."""
    if base_model == SMOLLM2 and smollm2_is_converted(models_dir):
        return str(smollm2_converted_dir(models_dir))
    folder = local_folder(base_model)
    return str(folder.resolve()) if folder is not None else None


def export_adapter(sampler: Path, out: Path, card: dict[str, Any], models_dir: Path) -> str:
    """Write the adapter folder into `out` (an empty folder); the base model's name."""
    folder, record = ckpt.find_sampler(sampler)  # checks every file against the manifest
    base_model = str(record["base_model"])
    shutil.copyfile(folder / ADAPTER_WEIGHTS, out / ADAPTER_WEIGHTS)
    _check_copy(folder, out, ADAPTER_WEIGHTS)
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    # A local folder is named by its absolute path, so peft finds it from anywhere.
    location = base_location(base_model, models_dir)
    config["base_model_name_or_path"] = (
        location if location and local_folder(base_model) else base_model
    )
    config["inference_mode"] = True
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    load_tokenizer(base_model, models_dir).save_pretrained(str(out))
    (out / "README.md").write_text(
        model_card(card, base_model, merged=False, base_location=location)
    )
    return base_model


def export_merged(sampler: Path, out: Path, card: dict[str, Any], models_dir: Path) -> str:
    """Write base model + adapter merged (safetensors) and the tokenizer into `out`."""
    import torch
    from peft import PeftModel

    folder, record = ckpt.find_sampler(sampler)
    base_model = str(record["base_model"])
    # float32 on the CPU: the merge adds the low-rank product at full precision.
    model, tokenizer = load_model_and_tokenizer(base_model, models_dir, "cpu", "float32")
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head" in (
        config.get("target_modules") or []
    ):
        # The adapter changes the unembedding only: merged into a tied lm_head it would change
        # the input embeddings too, so the merged model gets its own lm_head weight.
        embeddings = model.get_input_embeddings().weight
        assert isinstance(embeddings, torch.Tensor)  # typed as nn.Module's any-attribute
        model.lm_head.weight = torch.nn.Parameter(embeddings.detach().clone())
        model.config.tie_word_embeddings = False
        text_config = getattr(model.config, "get_text_config", lambda: None)()
        if text_config is not None:
            text_config.tie_word_embeddings = False
    peft_model = PeftModel.from_pretrained(model, str(folder))
    merged = peft_model.merge_and_unload()
    merged.config.name_or_path = base_model
    merged.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    location = base_location(base_model, models_dir)
    (out / "README.md").write_text(
        model_card(card, base_model, merged=True, base_location=location)
    )
    return base_model


def _check_copy(source: Path, out: Path, name: str) -> None:
    """The copy must hash as the checkpoint's manifest says (a disk error shows up here)."""
    manifest = (
        json.loads((source / MANIFEST_FILE).read_text())
        if (source / MANIFEST_FILE).is_file()
        else None
    )
    expected = (manifest or {}).get("files", {}).get(name, {}).get("sha256")
    if expected is None:
        return
    digest = hashlib.sha256()
    with (out / name).open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ckpt.CheckpointUnusable(
            f"the copy of {name} does not match the checkpoint's manifest"
        )
