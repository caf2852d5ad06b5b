"""The run's side of several engine hosts (issue 55), without hosts: a group's datums split in
contiguous shares and its outputs merged as the engine merges its micro-batches'; a spread
sampler's calls to the host with the fewest in flight, counted."""

from __future__ import annotations

from typing import Any

import pytest
from tinker import types

from runners.backends.group_training import GroupTraining, gathered, merged, split
from runners.backends.spread_sampling import SpreadSampling, spread_metrics
from runners.engine.futures import LocalFuture, resolved


def test_datums_split_in_contiguous_shares_as_even_as_can_be() -> None:
    assert split(list(range(8)), 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split([1], 3) == [[1], [], []]


def output(loss: float, peak: float, n: int) -> types.ForwardBackwardOutput:
    return types.ForwardBackwardOutput(
        loss_fn_output_type="TensorData",
        loss_fn_outputs=[
            {"i": types.TensorData(data=[float(i)], dtype="float32")} for i in range(n)
        ],
        metrics={"loss:sum": loss, "mismatch_logprob_diff:max": peak},
    )


def test_outputs_merge_in_datum_order_sums_summed_maxima_max() -> None:
    out = merged([output(1.5, 0.25, 2), output(2.0, 0.5, 1)])
    assert out.metrics == {"loss:sum": 3.5, "mismatch_logprob_diff:max": 0.5}
    assert [o["i"].data for o in out.loss_fn_outputs] == [[0.0], [1.0], [0.0]]


def test_gathered_waits_for_every_part_and_fails_with_the_first_failure() -> None:
    a, b = LocalFuture[int](), LocalFuture[int]()
    both = gathered([a, b], sum)
    a.set_result(1)
    assert not both.done()
    b.set_result(2)
    assert both.result(timeout=1) == 3
    c, d = LocalFuture[int](), LocalFuture[int]()
    failing = gathered([c, d], sum)
    c.set_exception(RuntimeError("rank 0 lost its host"))
    with pytest.raises(RuntimeError, match="rank 0 lost its host"):
        failing.result(timeout=1)
    d.set_result(1)  # a late part changes nothing


class Part:
    """A host's sampler as the spread sees one: each call a future, answered when told."""

    def __init__(self) -> None:
        self.calls: list[LocalFuture[Any]] = []

    def sample(self, *args: Any, **kwargs: Any) -> LocalFuture[Any]:
        self.calls.append(LocalFuture())
        return self.calls[-1]


def test_each_call_goes_to_the_host_with_the_fewest_in_flight() -> None:
    home, other = Part(), Part()
    spread = SpreadSampling([home, other])  # type: ignore[list-item]
    for _ in range(4):
        spread.sample("prompt", 1, None)
    assert (len(home.calls), len(other.calls)) == (2, 2)  # in turn while level
    home.calls[0].set_result("done")
    spread.sample("prompt", 1, None)
    assert (len(home.calls), len(other.calls)) == (3, 2)  # the host with room
    for call in home.calls + other.calls:
        if not call.done():
            call.set_result("done")
    assert spread_metrics(spread) == {"sampler/hosts": 2.0, "sampler/other_hosts_share": 0.4}
    assert spread_metrics(spread)["sampler/other_hosts_share"] == 0.0  # counted once
    assert spread_metrics(SpreadSampling([home])) == {}  # type: ignore[list-item]


class Rank:
    """A rank's training client as the group sees one: answers at once, counting datums."""

    base_model, lora_rank = "tiny-random", 4

    def __init__(self) -> None:
        self.calls: list[int] = []

    def forward_backward(self, data: list[Any], *_: Any) -> LocalFuture[Any]:
        self.calls.append(len(data))
        return resolved(output(float(len(data)), 0.0, len(data)))


def test_a_group_splits_its_datums_and_an_empty_batch_goes_to_rank_0() -> None:
    ranks = [Rank(), Rank()]
    group = GroupTraining(ranks)  # type: ignore[arg-type]
    out = group.forward_backward(["datum"] * 5, "importance_sampling").result(timeout=1)
    assert [rank.calls for rank in ranks] == [[3], [2]]
    assert out.metrics["loss:sum"] == 5.0 and len(out.loss_fn_outputs) == 5
    group.forward_backward([], "importance_sampling").result(timeout=1)
    assert [rank.calls for rank in ranks] == [[3, 0], [2]]
