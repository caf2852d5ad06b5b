"""Fixtures for the local backend tests: a CPU service in tmp folders, a tiny-random trainer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.engine.local import LocalServiceClient, LocalTrainingClient

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


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LocalServiceClient]:
    svc = local_service(tmp_path)
    yield svc
    svc.close()


@pytest.fixture
def trainer(service: LocalServiceClient) -> LocalTrainingClient:
    return service.create_lora_training_client("tiny-random", rank=8, seed=0).result(timeout=120)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` are skipped, saying so, where CUDA is not available."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu); none on this machine")
    for item in items:
        # The marker itself: `item.keywords` also holds the names of the parent folders.
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
