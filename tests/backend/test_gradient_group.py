"""A host group's ranks (runners/engine/train/group.py), in one process on two services: 8 datums
split 4+4 over 2 gloo ranks train as one client on all 8 (the ranks' gradients summed), and an
average in place of the sum is caught by the same comparison."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tinker import types

from benchmarks.rl_data import text_data
from runners.engine.local import LocalServiceClient, LocalTrainingClient
from runners.engine.train.group import GradientGroup
from tests.support.local_backend import local_service

# At 1e-2, Adam turns the summation order's rounding on near-zero gradient elements into
# updates of up to the learning rate (2.8e-5 apart after 5 steps); at 1e-4 they are 2.8e-7.
ADAM = types.AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-8)
TEXTS = [
    "hello world",
    "the cat sat on the mat",
    "a b c d e f g",
    "RL on a CPU, why not?",
    "one more line of text",
    "sums, not averages",
    "eight datums in all",
    "split four and four",
]
STEPS = 5


def datums(trainer: LocalTrainingClient) -> list[types.Datum]:
    """TEXTS as datums, longest first: the ranks' shares (4 + 4) are then the micro-batches one
    client cuts with a budget of half the rows."""
    return text_data(trainer.get_tokenizer(), TEXTS)


def train(trainer: LocalTrainingClient, data: list[types.Datum]) -> list[float]:
    """STEPS steps on `data`; each step's gradient norm."""
    norms = []
    for _ in range(STEPS):
        trainer.forward_backward(data, "importance_sampling")
        norms.append(trainer.optim_step(ADAM).result(timeout=120).metrics["grad_norm"])
    return norms


@pytest.fixture
def services(tmp_path: Path):
    made = [local_service(tmp_path / f"host{i}") for i in range(3)]
    yield made
    for service in made:
        service.close()


def grouped(
    services: list[LocalServiceClient], store: Path, op: dist.ReduceOp
) -> tuple[list[LocalTrainingClient], list[list[float]]]:
    """Two ranks (seeds 0 and 7: the join gives rank 1 rank 0's weights) trained on 4 datums
    each, side by side."""
    ranks = [
        services[i].create_lora_training_client("tiny-random", rank=4, seed=seed).result()
        for i, seed in ((1, 0), (2, 7))
    ]
    with ThreadPoolExecutor(2) as pool:
        groups = list(
            pool.map(lambda rank: GradientGroup(store, rank, 2, "gloo", 60.0, op), range(2))
        )
        joined = [r.join_group(g) for r, g in zip(ranks, groups, strict=True)]
        for future in joined:
            future.result(timeout=60)
        data = datums(ranks[0])
        norms = list(pool.map(train, ranks, [data[:4], data[4:]]))
    return ranks, norms


def max_diff(a: LocalTrainingClient, b: LocalTrainingClient) -> float:
    ta, tb = a.adapter_tensors(), b.adapter_tensors()
    return max(float((ta[n] - tb[n]).abs().max()) for n in ta)


def test_two_ranks_of_four_datums_train_as_one_client_of_eight(services, tmp_path) -> None:
    """Bit for bit what one client gets cutting the 8 as the ranks do (two micro-batches of 4);
    against one pass of all 8, float32's rounding of a product of 8 rows against two of 4."""
    alone = services[0].create_lora_training_client("tiny-random", rank=4, seed=0).result()
    data = datums(alone)
    half = max(d.model_input.length for d in data) * len(data) // 2
    cut = local_service(tmp_path / "cut", tokens_per_microbatch=half)
    try:
        halves = cut.create_lora_training_client("tiny-random", rank=4, seed=0).result()
        want_norms = train(halves, data)
        one_pass = train(alone, data)
        ranks, norms = grouped(services, tmp_path / "store", dist.ReduceOp.SUM)
        assert max_diff(ranks[0], ranks[1]) == 0.0  # the same AdamW step on every rank
        assert max_diff(ranks[0], halves) == 0.0
        assert norms[0] == norms[1] == want_norms
        assert max_diff(ranks[0], alone) <= 1e-6
        assert norms[0] == pytest.approx(one_pass, rel=1e-5)
    finally:
        cut.close()


def test_an_average_of_the_ranks_fails_the_same_comparison(services, tmp_path) -> None:
    alone = services[0].create_lora_training_client("tiny-random", rank=4, seed=0).result()
    want_norms = train(alone, datums(alone))
    _, norms = grouped(services, tmp_path / "store", dist.ReduceOp.AVG)
    # An average is the sum halved: DDP's and FSDP2's default, wrong for losses that sum.
    assert norms[0][0] == pytest.approx(want_norms[0] / 2, rel=1e-5)
    assert norms[0] != pytest.approx(want_norms, rel=1e-5)


def test_a_rank_outside_its_group_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="rank 2 is outside a group of 2"):
        GradientGroup(tmp_path / "store", 2, 2, "gloo", 5.0)


def test_a_model_joins_one_group_only(services, tmp_path) -> None:
    trainer = services[0].create_lora_training_client("tiny-random", rank=4, seed=0).result()
    group = GradientGroup(tmp_path / "store", 0, 1, "gloo", 30.0)
    trainer.join_group(group).result(timeout=60)
    with pytest.raises(ValueError, match="a rank of a group already"):
        trainer.join_group(group)
    assert torch.isfinite(torch.tensor(train(trainer, datums(trainer)))).all()


def test_a_rank_with_no_datums_still_takes_the_groups_step(services, tmp_path) -> None:
    """One datum over two ranks (1 + 0): the idle rank's step takes the sum too, and no rank
    steps a parameter no pass reached (as one host would not)."""
    alone = services[0].create_lora_training_client("tiny-random", rank=4, seed=0).result()
    one = datums(alone)[:1]
    want = train(alone, one)
    ranks = [
        services[i].create_lora_training_client("tiny-random", rank=4, seed=0).result()
        for i in (1, 2)
    ]
    with ThreadPoolExecutor(2) as pool:
        groups = list(
            pool.map(lambda rank: GradientGroup(tmp_path / "store", rank, 2, "gloo", 60.0), [0, 1])
        )
        for future in [r.join_group(g) for r, g in zip(ranks, groups, strict=True)]:
            future.result(timeout=60)
        idle = pool.submit(lambda: [ranks[1].optim_step(ADAM).result() for _ in range(STEPS)])
        norms = train(ranks[0], one)
        idle.result(timeout=120)
    assert norms == pytest.approx(want, rel=1e-6)
    assert max_diff(ranks[0], ranks[1]) == 0.0
    assert max_diff(ranks[0], alone) <= 1e-6
