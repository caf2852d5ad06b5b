"""Fixtures for the local backend tests: a CPU service in tmp folders, a tiny-random trainer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.engine.local import LocalServiceClient, LocalTrainingClient
from tests.support.local_backend import local_service


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
