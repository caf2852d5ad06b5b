"""One run training on K engine hosts as one host group (issue 55; a config's `num_devices`):
the TrainingClient a run's step sees, over one model per host, joined in a process group.

    forward_backward(datums) -> K contiguous shares, one per rank's host, side by side
                             -> outputs in datum order, metrics merged (sums summed, maxima max)
    optim_step               -> every rank: the ranks' gradients summed, then the same AdamW
    save_*, snapshot, tokenizer, ... -> rank 0 (every rank holds the same weights)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tinker import types

from runners.engine.futures import LocalFuture

if TYPE_CHECKING:
    from runners.backends.engine_backend import EngineTraining

T = TypeVar("T")
R = TypeVar("R")


class GroupTraining:
    """TrainingClient: a run's model on each of its group's hosts, rank 0 first."""

    def __init__(self, ranks: list[EngineTraining]) -> None:
        self.ranks = ranks
        self.base_model = ranks[0].base_model
        self.lora_rank = ranks[0].lora_rank

    def join(
        self, store: str, backend: Literal["gloo", "nccl"], timeout_s: float
    ) -> LocalFuture[list[Any]]:
        """Every rank joins the group meeting in the file `store` (rank 0's weights taken)."""
        size = len(self.ranks)
        return gathered(
            [r.join_group(store, i, size, backend, timeout_s) for i, r in enumerate(self.ranks)],
            list,
        )

    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: dict[str, Any] | None = None,
    ) -> LocalFuture[types.ForwardBackwardOutput]:
        return self._split(
            data, lambda rank, share: rank.forward_backward(share, loss_fn, loss_fn_config)
        )

    def forward(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: dict[str, Any] | None = None,
    ) -> LocalFuture[types.ForwardBackwardOutput]:
        return self._split(data, lambda rank, share: rank.forward(share, loss_fn, loss_fn_config))

    def optim_step(
        self, optim_params: types.AdamParams | None = None, **kwargs: Any
    ) -> LocalFuture[types.OptimStepResponse]:
        """Every rank steps (each sums the ranks' gradients first); rank 0's answer."""
        steps = [rank.optim_step(optim_params, **kwargs) for rank in self.ranks]
        return gathered(steps, lambda answers: answers[0])

    def __getattr__(self, name: str) -> Any:
        # What reads or saves the weights: rank 0's (every rank holds the same).
        return getattr(self.ranks[0], name)

    def _split(
        self,
        data: list[types.Datum],
        call: Callable[
            [EngineTraining, list[types.Datum]], LocalFuture[types.ForwardBackwardOutput]
        ],
    ) -> LocalFuture[types.ForwardBackwardOutput]:
        if not data:  # nothing to split: rank 0 answers as one host would
            return call(self.ranks[0], data)
        shares = split(data, len(self.ranks))
        parts = [call(rank, share) for rank, share in zip(self.ranks, shares, strict=True) if share]
        return gathered(parts, merged)


def split(items: Sequence[T], ways: int) -> list[list[T]]:
    """`items` in `ways` contiguous shares, as even as can be (8 in 2: 4 + 4; 5 in 2: 3 + 2)."""
    size, extra = divmod(len(items), ways)
    shares, start = [], 0
    for index in range(ways):
        end = start + size + (1 if index < extra else 0)
        shares.append(list(items[start:end]))
        start = end
    return shares


def merged(outputs: list[types.ForwardBackwardOutput]) -> types.ForwardBackwardOutput:
    """The ranks' outputs as one: per-datum outputs in datum order; metrics summed over the
    ranks, those named `:max` (`:min`) their largest (smallest), as the engine merges its
    micro-batches'."""
    metrics: dict[str, float] = {}
    for output in outputs:
        for key, value in output.metrics.items():
            if key not in metrics:
                metrics[key] = value
            elif key.endswith(":max"):
                metrics[key] = max(metrics[key], value)
            elif key.endswith(":min"):
                metrics[key] = min(metrics[key], value)
            else:
                metrics[key] += value
    return types.ForwardBackwardOutput(
        loss_fn_output_type=outputs[0].loss_fn_output_type,
        loss_fn_outputs=[o for output in outputs for o in output.loss_fn_outputs],
        metrics=metrics,
    )


def gathered(parts: list[LocalFuture[T]], combine: Callable[[list[T]], R]) -> LocalFuture[R]:
    """One future of every part's result, combined; the first failure fails it."""
    out: LocalFuture[R] = LocalFuture()
    left = [len(parts)]
    lock = threading.Lock()

    def one_done(_: Any) -> None:
        with lock:
            left[0] -= 1
            if out.done():
                return
            failed = next((p.exception() for p in parts if p.done() and p.exception()), None)
            if failed is not None:
                out.set_exception(failed)
            elif left[0] == 0:
                try:
                    out.set_result(combine([p.result() for p in parts]))
                except Exception as exc:  # an answer that does not combine is the host's bug
                    out.set_exception(exc)

    for part in parts:
        part.add_done_callback(one_done)
    return out
