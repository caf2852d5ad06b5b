"""Fixtures for the local backend tests: a CPU service in tmp folders, a tiny-random trainer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.backends.local import LocalServiceClient, LocalTrainingClient


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LocalServiceClient]:
    # float32 sampling: these tests compare sampler and trainer logprobs to float32 rounding
    # (test_sampling_model.py covers the bfloat16 sampler that `auto` picks on most CPUs).
    svc = LocalServiceClient(
        checkpoint_dir=tmp_path / "checkpoints",
        models_dir=tmp_path / "models",
        device="cpu",
        sampling_dtype="float32",
    )
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
