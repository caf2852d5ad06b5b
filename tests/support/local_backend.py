"""The local backend as the tests run it: a service with its folders under a tmp folder, on
the device the tests are told (RLCS_TEST_DEVICE), in float32 unless told."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from tinker import types

from runners.engine.local import LocalSamplingClient, LocalServiceClient

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


def while_decoding(
    sampler: LocalSamplingClient, max_tokens: int, then: Callable[[], list[Future]]
) -> list[Future]:
    """A request on `sampler` whose first token holds the decode thread until `then()` has
    sent its requests (so they queue, and are admitted together while it still decodes and
    keeps its slot); every future answered, its own first."""
    decoding, release = threading.Event(), threading.Event()

    def hold_the_thread(*_: object) -> None:
        if not decoding.is_set():
            decoding.set()
            assert release.wait(timeout=60)

    params = types.SamplingParams(max_tokens=max_tokens, seed=2, stop=[])
    first = sampler.sample(
        types.ModelInput.from_ints([1, 2, 3]), 1, params, on_token=hold_the_thread
    )
    assert decoding.wait(timeout=60)
    futures = [first, *then()]
    release.set()
    for future in futures:
        future.result(timeout=60)
    return futures
