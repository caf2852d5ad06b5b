"""forward_backward through the API gives the numbers the in-process local backend gives, for
every loss, and so does the optimizer step after it; forward alone, and the SDK's client-side
custom loss (forward, then cross_entropy with the loss's gradients as weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tinker
import torch

from tests.tinker_api.conftest import WAIT_S
from tests.tinker_api.reference import ADAM, LOSS_CONFIGS, datums, local_service, logprobs

pytestmark = pytest.mark.timeout(180)


def test_each_loss_and_its_step_match_the_local_backend(
    service: tinker.ServiceClient, tmp_path: Path
) -> None:
    local = local_service(tmp_path)
    try:
        for index, (loss_fn, config) in enumerate(LOSS_CONFIGS.items()):
            seed = 100 + index
            remote = service.create_lora_training_client("tiny-random", rank=4, seed=seed).result(
                WAIT_S
            )
            here = local.create_lora_training_client("tiny-random", rank=4, seed=seed).result()
            data = datums(loss_fn, seed)
            # Submitted back to back, as scripts do: they run in order.
            fb = remote.forward_backward(data, loss_fn, config)
            step = remote.optim_step(ADAM)
            after = remote.forward(data, loss_fn, config)
            want_fb = here.forward_backward(data, loss_fn, config).result()
            want_step = here.optim_step(ADAM).result()
            want_after = here.forward(data, loss_fn, config).result()

            got_fb, got_after = fb.result(WAIT_S), after.result(WAIT_S)
            assert got_fb.metrics["loss:sum"] == pytest.approx(
                want_fb.metrics["loss:sum"], rel=1e-5
            ), loss_fn
            for got, want in zip(logprobs(got_fb), logprobs(want_fb), strict=True):
                assert got == pytest.approx(want, abs=1e-5)
            assert step.result(WAIT_S).metrics["grad_norm"] == pytest.approx(
                want_step.metrics["grad_norm"], rel=1e-4
            )
            # The step moved the adapter as the local one moved: the loss after agrees too.
            assert got_after.metrics["loss:sum"] == pytest.approx(
                want_after.metrics["loss:sum"], rel=1e-4
            ), loss_fn
            assert got_after.metrics["loss:sum"] != pytest.approx(got_fb.metrics["loss:sum"])
    finally:
        local.close()


def test_the_sdk_custom_loss_runs_on_cross_entropy(service: tinker.ServiceClient) -> None:
    training = service.create_lora_training_client("tiny-random", rank=4, seed=7).result(WAIT_S)
    data = datums("cross_entropy", 7)

    def mean_logprob_loss(
        batch: list[tinker.Datum], lps: list[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss = -torch.cat(lps).mean()
        return loss, {"custom_loss": float(loss.detach())}

    before = training.forward(data, "cross_entropy").result(WAIT_S)
    out = training.forward_backward_custom(data, mean_logprob_loss).result(WAIT_S)
    flat = [v for lp in logprobs(before) for v in lp]
    assert out.metrics["custom_loss"] == pytest.approx(-sum(flat) / len(flat), rel=1e-5)
    training.optim_step(ADAM).result(WAIT_S)
    after = training.forward(data, "cross_entropy").result(WAIT_S)
    flat_after = [v for lp in logprobs(after) for v in lp]
    assert sum(flat_after) > sum(flat)  # the step raised the mean logprob it was told to


def test_an_rl_loss_reports_the_gap_and_corrects_only_when_asked(
    service: tinker.ServiceClient,
) -> None:
    """Issue 53: forward_backward's mismatch metrics reach an SDK script, merged by their
    suffix, and agree with its own logprobs; a script that sends no config gets Tinker's
    objective (nothing corrected), one that sends rollout_is_threshold gets the truncation."""
    training = service.create_lora_training_client("tiny-random", rank=4, seed=9).result(WAIT_S)
    data = datums("importance_sampling", 9)
    plain = training.forward(data, "importance_sampling").result(WAIT_S)
    sampler_lp = [
        [q for q, a in zip(d.loss_fn_inputs["logprobs"].tolist(),
                           d.loss_fn_inputs["advantages"].tolist(), strict=True) if q or a]
        for d in data
    ]  # fmt: skip
    trainer_lp = [
        got[len(got) - len(want) :] for got, want in zip(logprobs(plain), sampler_lp, strict=True)
    ]
    diffs = torch.tensor([t - q for ts, qs in zip(trainer_lp, sampler_lp, strict=True)
                          for t, q in zip(ts, qs, strict=True)])  # fmt: skip
    ratio = diffs.exp()
    metrics = plain.metrics
    assert metrics["mismatch_tokens:sum"] == len(diffs)
    assert metrics["mismatch_k3:sum"] == pytest.approx(float((ratio - 1 - diffs).sum()), rel=1e-4)
    assert metrics["mismatch_logprob_diff:max"] == pytest.approx(float(diffs.abs().max()), rel=1e-4)
    outside = float(((ratio < 0.5) | (ratio > 2)).sum())
    assert metrics["mismatch_ratio_outside:sum"] == outside
    assert metrics["corrected_tokens:sum"] == 0  # Tinker's objective: no config, no correction

    threshold = float(ratio.median())  # half the tokens above it
    truncated = training.forward(
        data, "importance_sampling", {"rollout_is_threshold": threshold}
    ).result(WAIT_S)
    assert truncated.metrics["is_truncated:sum"] == float((ratio > threshold).sum()) > 0
    assert truncated.metrics["loss:sum"] != pytest.approx(metrics["loss:sum"])
