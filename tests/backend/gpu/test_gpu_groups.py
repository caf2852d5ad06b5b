"""A host group's ranks on one GPU (issue 55): two services on the same GPU as gloo ranks (NCCL
refuses two ranks on one GPU), bf16 autocast, 8 datums split 4+4 against one client on all 8:
the same gradient norms and weights within bfloat16's rounding (1e-3 relative). Marked `gpu`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from runners.engine.train.group import GradientGroup
from tests.backend.test_gradient_group import datums, grouped, train
from tests.support.local_backend import local_service


@pytest.fixture
def cuda_services(tmp_path: Path):
    made = [
        local_service(tmp_path / f"host{i}", device="cuda", dtype="auto", sampling_dtype="auto")
        for i in range(3)
    ]
    yield made
    for service in made:
        service.close()


def test_two_gloo_ranks_on_one_gpu_train_as_one_client(cuda_services, tmp_path: Path) -> None:
    alone = cuda_services[0].create_lora_training_client("tiny-random", rank=4, seed=0).result()
    want_norms = train(alone, datums(alone))
    ranks, norms = grouped(cuda_services, tmp_path / "store", dist.ReduceOp.SUM)
    assert norms[0] == norms[1]
    assert norms[0] == pytest.approx(want_norms, rel=1e-3)
    mine, theirs = ranks[0].adapter_tensors(), alone.adapter_tensors()
    largest = max(float(t.abs().max()) for t in theirs.values())
    diff = max(float((mine[n] - theirs[n]).abs().max()) for n in mine)
    assert diff <= 1e-3 * largest, (diff, largest)


def test_a_gloo_sum_of_cuda_tensors_stays_on_the_gpu(tmp_path: Path) -> None:
    group = GradientGroup(tmp_path / "store", 0, 1, "gloo", 30.0)
    buffer = torch.ones(1000, device="cuda")
    group.sum_(buffer)
    assert buffer.device.type == "cuda" and float(buffer.sum()) == 1000.0
    group.close()
