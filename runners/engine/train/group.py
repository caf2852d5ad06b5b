"""A run's training clients on several engine hosts as one process group (issue 55): each rank
trains its share of a step's datums, the ranks' flat LoRA gradients are summed (our losses are
sums over tokens, so a sum, never DDP's average), and every rank takes the same AdamW step.

    rank r (host r): forward_backward(its datums) -> flat grads -> all_reduce SUM (all ranks)
                     -> grads = the sum -> clip, AdamW (the same on every rank)

The group is torch.distributed's own process group, built from a file store (no global world,
so a long-lived host can be a rank of several runs' groups): gloo on the CPU and where two
ranks share a GPU (NCCL refuses them), NCCL where each rank has a GPU of its own.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

Backend = Literal["gloo", "nccl"]
# The reduction of the ranks' gradients: our losses sum over tokens, so their gradients sum.
SUM = dist.ReduceOp.SUM


class GradientGroup:
    """This rank's end of a run's process group (`size` ranks, rendezvous in the file `store`)."""

    def __init__(
        self,
        store: Path,
        rank: int,
        size: int,
        backend: Backend,
        timeout_s: float,
        reduce_op: dist.ReduceOp.RedOpType = SUM,
    ) -> None:
        """Blocks until every rank has joined (or `timeout_s` passes: RuntimeError)."""
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is outside a group of {size}")
        self.rank, self.size, self.backend = rank, size, backend
        self._reduce_op: Any = reduce_op  # AllreduceOptions takes it; the stubs disagree
        timeout = datetime.timedelta(seconds=timeout_s)
        file_store = dist.FileStore(str(store), size)
        file_store.set_timeout(timeout)
        # Any: torch's stubs give its process groups no collectives (they have them).
        self._group: Any = _process_group(file_store, rank, size, backend, timeout)

    def sum_(self, flat: torch.Tensor) -> None:
        """`flat` becomes the sum of every rank's `flat`, in place."""
        options = dist.AllreduceOptions()
        options.reduceOp = self._reduce_op
        self._group.allreduce([flat], options).wait()

    def broadcast_(self, flat: torch.Tensor) -> None:
        """`flat` becomes rank 0's `flat`, in place."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.rootTensor = 0
        self._group.broadcast([flat], options).wait()

    def close(self) -> None:
        shutdown = getattr(self._group, "shutdown", None)
        if callable(shutdown):
            shutdown()


def _process_group(
    store: dist.Store, rank: int, size: int, backend: Backend, timeout: datetime.timedelta
) -> dist.ProcessGroupGloo | dist.ProcessGroupNCCL:
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    options_gloo = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # not in stubs
    options_gloo._timeout = timeout
    # The ranks are hosts of one machine: gloo's pairs listen on loopback only.
    options_gloo._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, size, options_gloo)


def flatten(tensors: Iterable[torch.Tensor | None], like: Iterable[torch.Tensor]) -> torch.Tensor:
    """One float32 buffer of `tensors` in order (a None: zeros shaped like its `like`)."""
    parts = [
        (t if t is not None else torch.zeros_like(shape)).detach().reshape(-1).float()
        for t, shape in zip(tensors, like, strict=True)
    ]
    return torch.cat(parts) if parts else torch.zeros(0)


def unflatten(flat: torch.Tensor, like: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """`flat` cut back into tensors shaped (and typed, and placed) like `like`."""
    out, start = [], 0
    for shape in like:
        n = shape.numel()
        out.append(flat[start : start + n].view(shape.shape).to(shape.dtype))
        start += n
    return out
