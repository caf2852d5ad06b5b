"""gspo and stable_reinforce through the local training client on tiny-random: datums built as
tinker-cookbook 0.6.1 builds them, losses equal to their definitions, bad provenance refused."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tinker import types

from core.loss_config import resolve
from runners.engine.local import LocalServiceClient, LocalTrainingClient
from runners.engine.recorded_sequences import SequenceStore, UnknownSequence
from tests.support.cookbook_datums import rl_datum
from tests.support.local_backend import local_service

DAY = 24 * 3600.0
ADAM = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
# A narrow band and a low truncation, so that a few steps off the sampler both happen.
NARROW = {"mask_low_threshold": 0.8, "mask_high_threshold": 1.25, "clip_high_threshold": 1.1}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def clock() -> Clock:
    return Clock()


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, clock: Clock) -> Iterator[LocalServiceClient]:
    # A small micro-batch budget: a call's datums span several passes, which must not mix them.
    folder: Path = tmp_path_factory.mktemp("sequence-losses")
    service = local_service(folder, tokens_per_microbatch=24, sequences=SequenceStore(clock=clock))
    yield service
    service.close()


@pytest.fixture(scope="module")
def tc(svc: LocalServiceClient) -> LocalTrainingClient:
    return svc.create_lora_training_client("tiny-random", rank=8, seed=0).result(timeout=120)


PROMPT = [83, 97, 121, 32, 65, 58]
PARAMS = types.SamplingParams(max_tokens=6, temperature=1.0, seed=11, stop=[])


def sampled(tc: LocalTrainingClient, n: int, record: bool = True) -> list[types.SampledSequence]:
    sampler = tc.save_weights_and_get_sampling_client(record_stability_info=record).result()
    return sampler.sample(types.ModelInput.from_ints(PROMPT), n, PARAMS).result().sequences


def move_learner(tc: LocalTrainingClient, steps: int = 3) -> None:
    """Some supervised steps, so the learner is no longer the sampler (ratios move off 1)."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(PROMPT[:-1]),
        loss_fn_inputs={"target_tokens": PROMPT[1:], "weights": [1.0] * (len(PROMPT) - 1)},
    )
    for _ in range(steps):
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(ADAM)


def stable_reinforce_by_definition(
    learner: list[np.ndarray], sequences: list[types.SampledSequence], advantages: list[float]
) -> tuple[float, int, int]:
    """The summed loss from the learner's target logprobs and the sampler's recorded ones
    (docs/tinker-api.md) with the NARROW config; and the masked, truncated token counts."""
    cfg = resolve("stable_reinforce", NARROW)
    loss, masked, truncated = 0.0, 0, 0
    for lp, seq, adv in zip(learner, sequences, advantages, strict=True):
        for l_t, q_t in zip(lp[len(PROMPT) - 1 :], seq.logprobs, strict=True):
            r = math.exp(float(l_t) - q_t)
            if not cfg["mask_low_threshold"] <= r <= cfg["mask_high_threshold"]:
                masked += 1
                continue
            w = min(r, cfg["clip_high_threshold"])
            truncated += int(w != r)
            loss -= w * adv * float(l_t) - cfg["kl_coeff"] / 2 * (float(l_t) - q_t) ** 2
    return loss, masked, truncated


def test_stable_reinforce_reads_the_recorded_sampler_logprobs(tc):
    sequences = sampled(tc, 6)
    advantages = [1.0, -1.0, 0.5, -0.5, 2.0, -2.0]
    move_learner(tc)
    honest = [rl_datum(PROMPT, s, a) for s, a in zip(sequences, advantages, strict=True)]
    # The client's copies of the sampler logprobs are not what the loss reads.
    lying = [
        rl_datum(PROMPT, s, a, logprobs=[-9.0] * len(s.tokens))
        for s, a in zip(sequences, advantages, strict=True)
    ]
    out = tc.forward(honest, "stable_reinforce", NARROW).result()
    assert tc.forward(lying, "stable_reinforce", NARROW).result().metrics == out.metrics
    learner = [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]
    expected, masked, truncated = stable_reinforce_by_definition(learner, sequences, advantages)
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert out.metrics["sampled_tokens:sum"] == sum(len(s.tokens) for s in sequences)
    assert out.metrics["masked_tokens:sum"] == masked
    assert out.metrics["truncated_tokens:sum"] == truncated
    assert masked > 0 and truncated > 0 and masked + truncated < 36  # every case is covered
    # importance_sampling does read the client's copies: the lie changes its loss.
    assert (
        tc.forward(lying, "importance_sampling").result().metrics["loss:sum"]
        != tc.forward(honest, "importance_sampling").result().metrics["loss:sum"]
    )
    # And it trains: forward_backward then a step, on the cookbook's datums.
    tc.forward_backward(honest, "stable_reinforce", {"kl_coeff": 0.1}).result()
    assert tc.optim_step(ADAM).result().metrics["grad_norm"] > 0


def test_spans_are_ignored_by_the_other_losses(tc):
    # The cookbook attaches provenance whenever its sequences have ids (always, here).
    seq = sampled(tc, 1, record=False)[0]
    datum = rl_datum(PROMPT, seq, 1.0)
    assert tc.forward([datum], "importance_sampling").result().metrics["loss:sum"] != 0


def test_a_sequence_that_is_not_recorded_fails_naming_it(tc, svc, clock):
    seq = sampled(tc, 1)[0]
    datum = rl_datum(PROMPT, seq, 1.0)
    tc.forward([datum], "stable_reinforce").result()  # recorded: fine
    clock.now += DAY + 1  # a day after its last use
    with pytest.raises(
        UnknownSequence,
        match=rf"data\[0\].model_input_spans\[0\]: sequence '{seq.sequence_id}' is not recorded",
    ):
        tc.forward([datum], "stable_reinforce")
    # One from a sampler made without record_stability_info was never recorded.
    unrecorded = sampled(tc, 1, record=False)[0]
    with pytest.raises(ValueError, match=f"'{unrecorded.sequence_id}' is not recorded"):
        tc.forward_backward([rl_datum(PROMPT, unrecorded, 1.0)], "stable_reinforce")
    # A ValueError: the Tinker engine answers it as a failed request of category user.
    assert issubclass(UnknownSequence, ValueError)


def test_provenance_that_does_not_match_the_recording_is_refused(tc):
    seq = sampled(tc, 1)[0]
    good = rl_datum(PROMPT, seq, 1.0)
    tc.forward([good], "stable_reinforce").result()

    swapped = list(seq.tokens)
    swapped[2] = (swapped[2] + 1) % 256
    changed = types.SampledSequence(
        stop_reason=seq.stop_reason,
        sequence_id=seq.sequence_id,
        tokens_np=np.asarray(swapped, dtype=np.int32),
        logprobs_np=seq.logprobs_np,
    )
    with pytest.raises(
        ValueError,
        match=rf"model_input_spans\[1\]: the datum's token {swapped[2]} at position "
        rf"{len(PROMPT) + 2} is not what sequence '{seq.sequence_id}' recorded at sampled "
        rf"tokens position 2 \({seq.tokens[2]}\)",
    ):
        tc.forward([rl_datum(PROMPT, changed, 1.0)], "stable_reinforce")

    too_far = types.Datum(
        model_input=good.model_input, loss_fn_inputs=good.loss_fn_inputs
    ).with_provenance(
        model_input=good.model_input_spans,
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=seq.sequence_id, offset=2, length=5),
            types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=len(seq.tokens)),
        ],
    )
    with pytest.raises(
        ValueError, match=r"loss_fn_input_spans\[0\]: positions \[2, 7\) of .* prompt, which has 6"
    ):
        tc.forward([too_far], "stable_reinforce")

    bare = types.Datum(model_input=good.model_input, loss_fn_inputs=good.loss_fn_inputs)
    with pytest.raises(ValueError, match=r"data\[0\]: loss 'stable_reinforce' needs provenance"):
        tc.forward([bare], "stable_reinforce")

    prompt_advantage = dict(good.loss_fn_inputs)
    prompt_advantage["advantages"] = types.TensorData.from_numpy(
        np.asarray([0.0, 0.3] + [1.0] * (len(PROMPT) - 3 + len(seq.tokens)), dtype=np.float32)
    )
    with pytest.raises(
        ValueError, match=r"advantages'\]\[1\] is 0.3 on a target that is no sampled"
    ):
        tc.forward(
            [
                types.Datum(
                    good.model_input,
                    prompt_advantage,
                    good.model_input_spans,
                    good.loss_fn_input_spans,
                )
            ],
            "stable_reinforce",
        )


def test_gspo_takes_each_datums_own_sequence_ratio(tc):
    sequences = sampled(tc, 5, record=False)
    advantages = [1.0, -1.0, 0.5, -0.5, 1.5]
    move_learner(tc, 2)
    data = []
    for i, (seq, adv) in enumerate(zip(sequences, advantages, strict=True)):
        keep = len(seq.tokens) - i % 3  # datums of different lengths
        tokens = PROMPT + seq.tokens[:keep]
        ob_len = len(PROMPT) - 1
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": [0.0] * ob_len + seq.logprobs[:keep],
                    "advantages": [0.0] * ob_len + [adv] * keep,
                    "sequence_ratio_mask": [0.0] * ob_len + [1.0] * keep,
                },
            )
        )
    config = {"clip_low_threshold": 0.97, "clip_high_threshold": 1.03}
    out = tc.forward(data, "gspo", config).result()
    expected = 0.0
    for datum, record in zip(data, out.loss_fn_outputs, strict=True):
        lp = record["logprobs"].to_numpy().astype(np.float64)
        q = datum.loss_fn_inputs["logprobs"].to_numpy()
        adv = datum.loss_fn_inputs["advantages"].to_numpy()
        mask = datum.loss_fn_inputs["sequence_ratio_mask"].to_numpy() != 0
        s = math.exp(float(np.mean(lp[mask] - q[mask])))
        expected -= float(np.minimum(s * adv, np.clip(s, 0.97, 1.03) * adv).sum())
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
