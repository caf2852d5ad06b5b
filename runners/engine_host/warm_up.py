"""An engine host's first-use costs, paid as it starts rather than by its first client: the
engine's imports and code, the CPU adapter kernel's build, the allocator's first arenas. A tiny
model's client samples and trains one step and is released, so what a host holds after its runs
end compares with what it held before them (benchmarks/engine_host.py, part kept). A failure
here is logged, never the host's end: its clients would find what failed themselves."""

from __future__ import annotations

import logging

import numpy as np
from tinker import types

from core.model_names import TINY_RANDOM
from runners.engine.local import LocalServiceClient

log = logging.getLogger("engine-host")


def warm_up(service: LocalServiceClient) -> None:
    """One RL step of tiny-random (built in-process: nothing to download), then nothing left."""
    try:
        _one_step(service)
    except Exception:
        log.exception("the warm-up failed (the host serves all the same)")
    else:
        log.info("warm")


def _one_step(service: LocalServiceClient) -> None:
    trainer = service.create_lora_training_client(TINY_RANDOM, rank=4, seed=0).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt = [1, 2, 3]
    params = types.SamplingParams(max_tokens=4, seed=0, temperature=1.0)
    sequence = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
    tokens = prompt + list(sequence.tokens)
    sampled = len(tokens) - len(prompt)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray(tokens[1:], dtype=np.int64)),
            "logprobs": _float([0.0] * (len(prompt) - 1) + list(sequence.logprobs or [])),
            "advantages": _float([0.0] * (len(prompt) - 1) + [1.0] * sampled),
        },
    )
    trainer.forward_backward([datum], "importance_sampling").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-4)).result()
    sampler.close()
    service.forget(trainer)


def _float(values: list[float]) -> types.TensorData:
    return types.TensorData.from_numpy(np.asarray(values, dtype=np.float32))
