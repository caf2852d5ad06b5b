"""The learner: one real step on the local backend (tiny-random) raises what has a positive
advantage."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tinker import types

from runners.train.learner import assign_advantages, datum, train_on
from tests.train.test_learner import seq


def test_one_step_on_the_local_backend_raises_what_has_a_positive_advantage(
    tmp_path: Path,
) -> None:
    from runners.engine.local import LocalServiceClient

    service = LocalServiceClient(
        checkpoint_dir=tmp_path / "checkpoints",
        models_dir=tmp_path / "models",
        device="cpu",
        dtype="float32",
        sampling_dtype="float32",
    )
    try:
        training = service.create_lora_training_client("tiny-random", rank=8, seed=0).result()
        good = seq(1.0, 0, 0, prompt=3, out=4)
        bad = seq(0.0, 0, 1, prompt=3, out=4)
        bad.tokens = [10, 11, 12, 20, 21, 22, 23]
        sequences = assign_advantages([good, bad], "grpo").sequences

        def learner_logprobs() -> list[list[float]]:
            datums = [d for d in map(datum, sequences) if d is not None]
            result = training.forward(datums, "importance_sampling").result()
            return [out["logprobs"].tolist() for out in result.loss_fn_outputs]

        before = learner_logprobs()
        for sequence, values in zip(sequences, before, strict=True):
            assert sequence.logprobs is not None
            sequence.logprobs = [0.0] + values  # the sampler was this very policy
        adam = types.AdamParams(learning_rate=0.05, beta1=0.9, beta2=0.95, eps=1e-8)
        metrics = asyncio.run(
            train_on(training, sequences, "importance_sampling", {}, adam, timeout_s=120)
        )
        assert metrics["train/num_datums"] == 2 and metrics["train/num_action_tokens"] == 8
        assert metrics["train/kl_sample_train_v1"] == pytest.approx(0.0, abs=1e-4)
        # -sum(advantage * ratio) with every ratio 1: -(4 x 0.5 + 4 x -0.5).
        assert metrics["train/loss_sum"] == pytest.approx(0.0, abs=1e-4)
        after = learner_logprobs()
        gained = [sum(a[2:]) - sum(b[2:]) for a, b in zip(after, before, strict=True)]
        assert gained[0] > 0 > gained[1]  # advantage +0.5 up, -0.5 down
        assert asyncio.run(train_on(training, [], "importance_sampling", {}, adam)) == {}
    finally:
        service.close()
