"""The datums gspo and stable_reinforce need, trained on the local engine against the
sequences its sampler recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tinker import types

from runners.train.learner import SEQUENCE_ID, Sequence, assign_advantages, datum, train_on
from tests.support.local_backend import local_service


def test_gspo_and_stable_reinforce_datums_train_on_the_local_engine(tmp_path: Path) -> None:
    service = local_service(tmp_path)
    try:
        training = service.create_lora_training_client("tiny-random", rank=8, seed=0).result()
        sampler = training.save_weights_and_get_sampling_client(record_stability_info=True).result()
        params = types.SamplingParams(max_tokens=5, temperature=1.0, seed=3, stop=[])
        sequences = []
        for i, prompt in enumerate([[5, 6, 7, 8], [9, 10]]):  # a 2-token prompt: short spans
            answer = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result()
            for j, sampled in enumerate(answer.sequences):
                tokens = list(sampled.tokens)
                sequences.append(
                    Sequence(
                        tokens=prompt + tokens,
                        trained=[False] * len(prompt) + [True] * len(tokens),
                        logprobs=[0.0] * len(prompt) + list(sampled.logprobs),
                        reward=float(j),
                        group=i,
                        sample=2 * i + j,
                        meta={SEQUENCE_ID: sampled.sequence_id},
                    )
                )
        sequences = assign_advantages(sequences, "grpo").sequences
        gspo = datum(sequences[0], "gspo")
        assert gspo is not None
        mask = gspo.loss_fn_inputs["sequence_ratio_mask"].tolist()
        assert mask == [0.0] * 3 + [1.0] * 5  # the trained targets
        stable = datum(sequences[2], "stable_reinforce")
        assert stable is not None and stable.loss_fn_input_spans is not None
        assert [(type(s).__name__, s.offset, s.length) for s in stable.loss_fn_input_spans] == [
            ("PromptProvenanceSpan", 1, 1),
            ("SampledProvenanceSpan", 0, 5),
        ]
        adam = types.AdamParams(learning_rate=1e-2)
        for loss in ("gspo", "stable_reinforce"):
            metrics = asyncio.run(train_on(training, sequences, loss, {}, adam, timeout_s=120))
            assert metrics["train/num_datums"] == 4, loss
        # On policy nothing is masked, and every sampled token is read from the record.
        assert metrics["train/sampled_tokens"] == 20 and metrics["train/masked_tokens"] == 0
        unnamed = Sequence([1, 2, 3], [False, True, True], [0.0] * 3, 0.0, 0, 0, [0.0] * 3)
        with pytest.raises(ValueError, match="sampled sequence's id"):
            datum(unnamed, "stable_reinforce")
    finally:
        service.close()
