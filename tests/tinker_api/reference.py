"""The same work done in-process on the local backend (LocalServiceClient), to compare the
API's numbers with: datums for every loss, and a tiny-random service in float32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tinker import types

from runners.engine.local import LocalServiceClient

LOSS_CONFIGS: dict[str, dict[str, float] | None] = {
    "cross_entropy": None,
    "importance_sampling": None,
    "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 2.0},
    "dro": {"beta": 0.05},
}
ADAM = types.AdamParams(learning_rate=5e-3, beta1=0.9, beta2=0.95, eps=1e-8)


def local_service(folder: Path) -> LocalServiceClient:
    return LocalServiceClient(
        checkpoint_dir=folder / "checkpoints",
        models_dir=folder / "models",
        device="cpu",
        sampling_dtype="float32",
    )


def datums(loss_fn: str, seed: int = 0) -> list[types.Datum]:
    """Three sequences of different lengths; prompt positions carry no advantage."""
    rng = np.random.default_rng(seed)
    out = []
    for length, prompt in ((9, 4), (6, 2), (12, 5)):
        tokens = rng.integers(0, 250, size=length + 1).tolist()
        inputs: dict[str, object]
        if loss_fn == "cross_entropy":
            weights = [0.0] * prompt + [1.0] * (length - prompt)
            inputs = {"target_tokens": tokens[1:], "weights": weights}
        else:
            logprobs = [0.0] * prompt + rng.uniform(-6, -4, length - prompt).tolist()
            advantages = [0.0] * prompt + [float(rng.normal())] * (length - prompt)
            inputs = {"target_tokens": tokens[1:], "logprobs": logprobs, "advantages": advantages}
        out.append(
            types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)
        )
    return out


def logprobs(output: types.ForwardBackwardOutput) -> list[list[float]]:
    return [record["logprobs"].tolist() for record in output.loss_fn_outputs]
