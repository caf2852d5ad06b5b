"""Model names every part agrees on, and each backend's default model (no torch here).

The local default is SmolLM2 (packaged offline); Tinker serves Qwen3 and Llama 3 families,
and its default is the model the GEM reference trains.
"""

from __future__ import annotations

from typing import Literal

Backend = Literal["local", "tinker"]

TINY_RANDOM = "tiny-random"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
LOCAL_DEFAULT_MODEL = SMOLLM2
TINKER_DEFAULT_MODEL = "Qwen/Qwen3-4B-Instruct-2507"

DEFAULT_MODELS: dict[str, str] = {"local": LOCAL_DEFAULT_MODEL, "tinker": TINKER_DEFAULT_MODEL}


def default_model(backend: str) -> str:
    """The model a config gets when nobody chose one, for the backend that will run it."""
    return DEFAULT_MODELS.get(backend, LOCAL_DEFAULT_MODEL)
