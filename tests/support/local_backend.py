"""The local backend as the tests run it: a service with its folders under a tmp folder, on
the device the tests are told (RLCS_TEST_DEVICE), in float32 unless told."""

from __future__ import annotations

import os
from pathlib import Path

from runners.engine.local import LocalServiceClient

# `RLCS_TEST_DEVICE=cuda` runs the backend tests on a GPU, still in float32 (the same
# tolerances hold; sampling then goes through slot batches and captured CUDA graphs).
TEST_DEVICE = os.environ.get("RLCS_TEST_DEVICE", "cpu")


def local_service(folder: Path, **options) -> LocalServiceClient:
    """A service with its folders under `folder`: float32 model and sampler on TEST_DEVICE
    unless told, since most tests compare sampler and trainer logprobs to float32 rounding
    (test_sampling_model.py covers the bfloat16 sampler that `auto` picks on most CPUs)."""
    settings = {"device": TEST_DEVICE, "dtype": "float32", "sampling_dtype": "float32", **options}
    return LocalServiceClient(
        checkpoint_dir=folder / "checkpoints", models_dir=folder / "models", **settings
    )
