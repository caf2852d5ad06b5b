"""Training lanes: clients on one base model train side by side, each lane on its own copy of
the LoRA modules over the same base weights, with what each would get alone; users spread
over the lanes; a pass beside another takes its rows in smaller micro-batches."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from runners.engine.host import SharedBase
from runners.engine.local import LocalServiceClient
from tests.backend.test_local_backend import ce_batch
from tests.backend.test_shared_base import base_storages, steps
from tests.support.local_backend import local_service


@pytest.fixture
def two_lanes(tmp_path: Path):
    service = local_service(tmp_path, training_lanes=2)
    yield service
    service.close()


def test_two_clients_train_at_the_same_time_on_two_lanes(two_lanes: LocalServiceClient) -> None:
    """One client's pass holds its lane (its loss waits) while the other's pass runs to its end
    on the other lane; on one lane it would wait for the first (test_shared_base.py)."""
    a = two_lanes.create_lora_training_client("tiny-random", rank=4, seed=1).result()
    b = two_lanes.create_lora_training_client("tiny-random", rank=4, seed=2).result()
    assert {a._host.lane, b._host.lane} == {0, 1}
    assert base_storages(a) == base_storages(b)  # one copy of the base's weights
    inside, b_trained = threading.Event(), threading.Event()
    saw_b_end: list[bool] = []

    def waiting_loss(logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        inside.set()
        saw_b_end.append(b_trained.wait(timeout=60))  # a's lane held meanwhile
        return -sum(lp.sum() for lp in logprobs), {}

    a_pass = a.forward_backward_of(ce_batch(a), waiting_loss)
    assert inside.wait(timeout=60)
    b.forward_backward(ce_batch(b), "cross_entropy").result(timeout=60)
    b_trained.set()
    a_pass.result(timeout=60)
    assert saw_b_end == [True]


def test_side_by_side_each_trains_as_it_would_alone(tmp_path: Path) -> None:
    alone = local_service(tmp_path / "alone")
    try:
        want = [
            steps(alone.create_lora_training_client("tiny-random", rank=4, seed=s).result(), 3)
            for s in (1, 2)
        ]
    finally:
        alone.close()
    lanes = local_service(tmp_path / "lanes", training_lanes=2)
    try:
        a = lanes.create_lora_training_client("tiny-random", rank=4, seed=1).result()
        b = lanes.create_lora_training_client("tiny-random", rank=4, seed=2).result()
        assert a._host.lane != b._host.lane
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda t: steps(t, 3), [a, b]))
    finally:
        lanes.close()
    assert got[0] == pytest.approx(want[0], rel=1e-5)
    assert got[1] == pytest.approx(want[1], rel=1e-5)


def test_users_spread_over_the_lanes_and_the_last_frees_the_base(
    two_lanes: LocalServiceClient,
) -> None:
    clients = [
        two_lanes.create_lora_training_client("tiny-random", rank=4, seed=s).result()
        for s in range(3)
    ]
    hosts = {id(c._host): c._host for c in clients}.values()
    assert sorted(h.lane for h in hosts) == [0, 1]  # a host of this shape on each lane
    assert sorted(h.users for h in hosts) == [1, 2]
    other = two_lanes.create_lora_training_client("tiny-random", rank=2).result()
    assert other._host.lock is other._host.shared.lanes[other._host.lane]  # another shape
    bare = two_lanes.create_sampling_client(base_model="tiny-random").result()
    assert bare._host.lane == 0  # the base model alone trains nothing: one lane
    for client in [*clients, other]:
        two_lanes.forget(client)
    bare.close()
    assert two_lanes.bases.loaded() == []


def test_a_pass_beside_another_takes_its_rows_in_a_share_of_the_budget() -> None:
    shared = SharedBase("m", lanes=2)
    lengths = [30, 20, 10, 10, 10]
    with shared.training_pass(4096, lengths) as alone:
        assert alone == 4096
        with shared.training_pass(4096, lengths) as beside:
            assert beside == 30 * 3  # 5 rows over 2 lanes: at most 3 of the longest each
        with shared.training_pass(64, lengths) as small:
            assert small == 64  # a smaller budget stays
    with shared.training_pass(4096, lengths) as again_alone:
        assert again_alone == 4096
