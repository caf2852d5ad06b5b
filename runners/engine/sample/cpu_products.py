"""The packed model's products on the CPU: the thread policy of a decode step, and oneDNN's
products on a base weight packed once in its own layout (a plain weight is re-laid out at every
call, which reads it three times), the residual added inside the product."""

from __future__ import annotations

import torch

# From this many rows a CPU decode step widens to every thread for its base products and
# attention; below it the whole step runs on one (measured on SmolLM2, 2 cores, median of 15
# to 30 interleaved rounds: at 3 rows 28.7 ms a step against 33.8 widened, at 8 rows 39.2
# against 46.6, at 16 rows 52.9 against 49.0: waking the second thread for each product costs
# more than it brings until the rows fill it).
WIDE_ROWS = 16


class Threads:
    """A CPU decode step's intra-op threads: one for its many small operations (waking a
    second thread costs them more than it saves), all for the large products and attention
    from `WIDE_ROWS` rows (below, one for the whole step). torch's setting belongs to the
    calling thread (OpenMP's and MKL's), so the sampler's narrowing leaves the trainer's alone."""

    def __init__(self, wide: int) -> None:
        self.wide = wide
        self.products = 1  # threads for this step's products and attention (1: none widen)
        self._narrowed = False

    def narrow(self, rows: int) -> None:
        """The start of a decode step of `rows` rows."""
        if self.wide > 1:
            torch.set_num_threads(1)
            self._narrowed = True
            self.products = self.wide if rows >= WIDE_ROWS else 1

    def widen(self) -> None:
        if self.products > 1:
            torch.set_num_threads(self.products)

    def narrow_again(self) -> None:
        if self.products > 1:
            torch.set_num_threads(1)

    def end(self) -> None:
        """Back to all threads (the step is over, or failed)."""
        if self._narrowed:
            torch.set_num_threads(self.wide)
            self._narrowed, self.products = False, 1


def uses_onednn(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN's packed products on a CPU that multiplies bf16 natively, for a bf16 copy."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class OneDnnProduct:
    """`x W^T + bias` (plus a residual, added inside the product) on W packed once by oneDNN;
    the products widen to the step's threads."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, threads: Threads) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
        self.bias = bias
        self.threads = threads

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        linear = torch.ops.mkldnn._linear_pointwise
        self.threads.widen()
        if residual is None:
            y = linear(x, self.weight, self.bias, "none", [], "")
        else:
            y = linear.binary(x, residual, self.weight, self.bias, "add")
        self.threads.narrow_again()
        return y
