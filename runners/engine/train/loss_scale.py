"""Dynamic loss scaling for a float16 trainer (CUDA): the loss times a power of two before
backward, so that small gradients survive fp16's narrow range; the gradients divided by it
before clipping and AdamW; a step whose gradients overflowed skipped, the scale lowered."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

# The usual first scale of a mean loss (torch's GradScaler's), here per target token: our
# losses are sums, so a LoRA weight's gradient adds one term per token and grows with them.
MEAN_LOSS_SCALE = 2.0**16
# Halving never goes below this: an overflow that halving cannot cure (a forward pass that is
# itself inf) keeps skipping steps instead of driving the scale to zero.
MIN_SCALE = 2.0**-24


def initial_scale(tokens: int) -> float:
    """The first scale for a loss summed over `tokens` target tokens: MEAN_LOSS_SCALE over the
    tokens, rounded up to a power of two (tiny-random's 63 tokens: 1024, where an fp16
    trainer's CE steps settled; 2^16 overflowed six steps in a row)."""
    return max(MEAN_LOSS_SCALE / 2.0 ** math.ceil(math.log2(max(1, tokens))), MIN_SCALE)


@dataclass
class DynamicLossScale:
    """One client's loss scale. It is set by the first backward pass and changes only in
    `update` (at optim_step), so every backward pass of a step (its micro-batches, several
    forward_backward calls) uses the same scale. Growth and backoff are GradScaler's."""

    scale: float | None = None  # None: the first backward pass sets it (`for_backward`)
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000  # finite steps in a row before the scale grows
    good_steps: int = 0  # finite steps since the scale last changed
    skipped_steps: int = 0  # steps skipped for overflow, all told

    def for_backward(self, tokens: int) -> float:
        """The scale of this step's backward passes (`tokens`: the pass's target tokens, which
        pick the first scale)."""
        if self.scale is None:
            self.scale = initial_scale(tokens)
        return self.scale

    def unscale_(self, grads: list[torch.Tensor]) -> None:
        """Divide the accumulated gradients by the scale in place (exact: a power of two)."""
        if grads and self.scale is not None:
            torch._foreach_mul_(grads, 1.0 / self.scale)

    def update(self, finite: bool) -> bool:
        """After a step's gradients were checked: True when the step may be taken. An overflow
        skips it and lowers the scale; `growth_interval` finite steps in a row raise it."""
        if not finite:
            if self.scale is not None:
                self.scale = max(self.scale * self.backoff_factor, MIN_SCALE)
            self.good_steps = 0
            self.skipped_steps += 1
            return False
        self.good_steps += 1
        if self.good_steps >= self.growth_interval and self.scale is not None:
            grown = self.scale * self.growth_factor
            if math.isfinite(grown):
                self.scale = grown
            self.good_steps = 0
        return True

    def state_dict(self) -> dict[str, Any]:
        """What a state checkpoint keeps: a resumed run starts at the scale it had settled on."""
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        scale = state["scale"]
        self.scale = None if scale is None else float(scale)
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state["skipped"])
