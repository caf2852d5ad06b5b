"""Fixtures for the local backend tests: a CPU service in tmp folders, a tiny-random trainer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.engine.local import LocalServiceClient, LocalTrainingClient


def local_service(folder: Path, **options) -> LocalServiceClient:
    """A service with its folders under `folder`: CPU and a float32 sampler unless told, since
    most tests compare sampler and trainer logprobs to float32 rounding
    (test_sampling_model.py covers the bfloat16 sampler that `auto` picks on most CPUs)."""
    settings = {"device": "cpu", "sampling_dtype": "float32", **options}
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
        if "gpu" in item.keywords:
            item.add_marker(skip)
