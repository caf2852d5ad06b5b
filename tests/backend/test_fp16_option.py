"""The float16 option where no GPU is needed: the dynamic loss scale as a unit, its place in a
training step (on a float32 trainer given a scale, where scaling by a power of two is exact),
which dtype trains under which autocast, and float16 refused off CUDA with the setting named.
The fp16 numbers themselves are tests/backend/gpu/test_gpu.py's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from runners.engine.local import LocalServiceClient, LocalTrainingClient
from runners.engine.sample.sampling_model import resolve_sampling_dtype
from runners.engine.train.forward import autocast_dtype
from runners.engine.train.loss_scale import MIN_SCALE, DynamicLossScale, initial_scale
from runners.engine.train.training import loss_scale_for
from runners.models import loading
from tests.backend.test_local_backend import ADAM, ce_batch

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


# ----- the scale as a unit ------------------------------------------------------------------


def test_the_first_scale_is_a_mean_loss_scale_per_token():
    """Our losses are sums: 2^16 (a mean loss's usual first scale) over the tokens, rounded
    up to a power of two."""
    assert initial_scale(1) == 2.0**16
    assert initial_scale(63) == initial_scale(64) == 2.0**10
    assert initial_scale(65) == 2.0**9
    assert initial_scale(0) == 2.0**16
    assert initial_scale(2**50) == MIN_SCALE


def test_the_first_backward_pass_sets_the_scale_and_the_rest_of_the_step_keeps_it():
    scale = DynamicLossScale()
    assert scale.for_backward(63) == 2.0**10
    assert scale.for_backward(3) == 2.0**10  # a second call of the step: the same scale
    scale.update(True)
    assert scale.for_backward(10_000) == 2.0**10


def test_unscale_divides_the_gradients_exactly():
    scale = DynamicLossScale(scale=2.0**10)
    grads = [torch.tensor([3.0, -1.5]) * 2.0**10, torch.tensor([[0.1]]) * 2.0**10]
    scale.unscale_(grads)
    assert torch.equal(grads[0], torch.tensor([3.0, -1.5]))
    assert torch.equal(grads[1], torch.tensor([[0.1]]))
    scale.unscale_([])  # no gradients: nothing to do


def test_an_overflow_skips_the_step_and_halves_the_scale():
    scale = DynamicLossScale(scale=2.0**16, growth_interval=3)
    assert scale.update(True) and scale.good_steps == 1
    assert not scale.update(False)
    assert (scale.scale, scale.good_steps, scale.skipped_steps) == (2.0**15, 0, 1)
    assert not scale.update(False)
    assert (scale.scale, scale.skipped_steps) == (2.0**14, 2)


def test_the_scale_grows_after_growth_interval_finite_steps_in_a_row():
    scale = DynamicLossScale(scale=8.0, growth_interval=3)
    assert all(scale.update(True) for _ in range(2))
    assert scale.scale == 8.0  # two good steps: not yet
    assert scale.update(True)
    assert (scale.scale, scale.good_steps) == (16.0, 0)
    scale.update(True)
    scale.update(False)  # an overflow starts the count again
    assert all(scale.update(True) for _ in range(2))
    assert scale.scale == 8.0


def test_the_scale_never_falls_below_its_floor():
    scale = DynamicLossScale(scale=MIN_SCALE * 2)
    for _ in range(5):
        scale.update(False)
    assert scale.scale == MIN_SCALE and scale.skipped_steps == 5


def test_the_scale_round_trips_through_its_state():
    scale = DynamicLossScale(scale=2.0**9, good_steps=7, skipped_steps=3)
    again = DynamicLossScale()
    again.load_state_dict(scale.state_dict())
    assert (again.scale, again.good_steps, again.skipped_steps) == (2.0**9, 7, 3)


# ----- which dtype trains how -------------------------------------------------------------


class _Head(nn.Module):
    """A model as autocast_dtype reads it: only its unembedding's dtype counts."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.head = nn.Linear(4, 4).to(dtype)

    def get_output_embeddings(self) -> nn.Module:
        return self.head


@pytest.mark.parametrize(
    ("device", "dtype", "want"),
    [
        (CUDA, torch.float16, torch.float16),
        (CUDA, torch.bfloat16, torch.bfloat16),
        (CUDA, torch.float32, None),
        (CPU, torch.bfloat16, None),
        (CPU, torch.float32, None),
    ],
)
def test_half_bases_train_under_autocast_in_their_own_dtype_on_cuda(device, dtype, want):
    assert autocast_dtype(device, _Head(dtype)) == want


def test_only_a_float16_trainer_scales_its_loss(trainer: LocalTrainingClient):
    assert trainer._loss_scale is None  # float32 (and bf16): no scale, no new metrics
    trainer.forward_backward(ce_batch(trainer), "cross_entropy")
    metrics = _optim_step(trainer)
    assert "loss_scale" not in metrics and "skipped_steps" not in metrics
    assert loss_scale_for(trainer._host) is None


# ----- the scale in a training step (float32, where a power of two scales exactly) ----------


def _scaled(trainer: LocalTrainingClient, scale: float | None) -> DynamicLossScale:
    """The trainer given a loss scale, as a float16 base on CUDA gets one."""
    trainer._loss_scale = DynamicLossScale(scale=scale)
    return trainer._loss_scale


def _optim_step(trainer: LocalTrainingClient) -> dict[str, float]:
    metrics = trainer.optim_step(ADAM).result().metrics
    assert metrics is not None
    return metrics


def _step_in_two_calls(trainer: LocalTrainingClient) -> dict[str, float]:
    data = ce_batch(trainer)
    trainer.forward_backward(data[:2], "cross_entropy")
    trainer.forward_backward(data[2:], "cross_entropy")
    return _optim_step(trainer)


def test_a_scaled_step_trains_exactly_as_an_unscaled_one(tmp_path):
    """The scale goes on every backward pass of a step (two calls, several micro-batches each)
    and comes off before clipping and AdamW: the weights are those of no scaling, bit for bit."""
    service = LocalServiceClient(
        checkpoint_dir=tmp_path / "c", models_dir=tmp_path / "m", device="cpu", dtype="float32",
        sampling_dtype="float32", tokens_per_microbatch=16,
    )  # fmt: skip
    try:
        plain, scaled = (
            service.create_lora_training_client("tiny-random", rank=4, seed=5).result()
            for _ in range(2)
        )
        scale = _scaled(scaled, 2.0**12)
        for step in range(3):
            want = _step_in_two_calls(plain)
            got = _step_in_two_calls(scaled)
            assert got["loss_scale"] == 2.0**12 and got["skipped_steps"] == 0.0
            assert got["grad_norm"] == want["grad_norm"], step
        assert scale.scale == 2.0**12 and scale.good_steps == 3
        for name, tensor in plain.adapter_tensors().items():
            assert torch.equal(scaled.adapter_tensors()[name], tensor), name
    finally:
        service.close()


def test_forward_alone_sets_no_scale_and_a_step_s_calls_share_one(trainer: LocalTrainingClient):
    scale = _scaled(trainer, None)
    data = ce_batch(trainer)
    trainer.forward(data, "cross_entropy").result()
    assert scale.scale is None  # no backward pass: no scale chosen
    tokens = sum(d.model_input.length for d in data[:2])
    trainer.forward_backward(data[:2], "cross_entropy").result()
    assert scale.scale == initial_scale(tokens)
    trainer.forward_backward(data[3:], "cross_entropy").result()
    metrics = _optim_step(trainer)
    assert metrics["loss_scale"] == initial_scale(tokens) and metrics["skipped_steps"] == 0.0


def test_an_overflowing_step_is_skipped_and_the_adapter_kept(trainer: LocalTrainingClient):
    """A scale float32 cannot hold the gradients at: the step is skipped (no inf or nan in the
    adapter, AdamW's state untouched), the scale halved; the next step trains."""
    before = {n: t.clone() for n, t in trainer.adapter_tensors().items()}
    scale = _scaled(trainer, 2.0**127)
    trainer.forward_backward(ce_batch(trainer), "cross_entropy")
    metrics = _optim_step(trainer)
    assert metrics["loss_scale"] == 2.0**127 and metrics["skipped_steps"] == 1.0
    assert metrics["grad_norm"] != metrics["grad_norm"]  # nan: the overflow, reported
    assert scale.scale == 2.0**126
    for name, tensor in trainer.adapter_tensors().items():
        assert torch.equal(tensor, before[name]), name
    assert not trainer._optimizer.state
    assert all(p.grad is None for p in trainer._host.params.values())
    scale.scale = 2.0**8
    trainer.forward_backward(ce_batch(trainer), "cross_entropy")
    metrics = _optim_step(trainer)
    assert metrics["skipped_steps"] == 1.0 and metrics["grad_norm"] > 0
    after = trainer.adapter_tensors()
    assert all(torch.isfinite(t).all() for t in after.values())
    assert any(not torch.equal(after[n], before[n]) for n in before)


def test_the_scale_is_saved_with_the_optimizer_state(trainer: LocalTrainingClient, service):
    scale = _scaled(trainer, 2.0**11)
    scale.skipped_steps = 2
    trainer.forward_backward(ce_batch(trainer), "cross_entropy")
    trainer.optim_step(ADAM)
    saved = trainer.save_state("scaled").result()
    other = service.create_lora_training_client("tiny-random", rank=8, seed=1).result()
    again = _scaled(other, 2.0**16)
    other.load_state_with_optimizer(saved.path).result()
    assert (again.scale, again.good_steps, again.skipped_steps) == (2.0**11, 1, 2)


# ----- float16 is a CUDA option -------------------------------------------------------------


def test_float16_is_refused_off_cuda_naming_the_setting(tmp_path):
    with pytest.raises(ValueError, match=r"dtype \(RLCS_DTYPE\) float16 is a CUDA option"):
        loading.resolve_dtype("float16", CPU)
    with pytest.raises(ValueError, match=r"RLCS_SAMPLING_DTYPE\) float16 is a CUDA option"):
        resolve_sampling_dtype("float16", torch.float32, CPU)
    with pytest.raises(ValueError, match="RLCS_DTYPE"):
        LocalServiceClient(
            checkpoint_dir=tmp_path, models_dir=tmp_path, device="cpu", dtype="float16"
        )


def test_float16_resolves_on_cuda_and_auto_samples_as_the_trainer():
    """No GPU needed: only the names resolve. bf16 stays CUDA's default."""
    assert loading.resolve_dtype("float16", CUDA) == torch.float16
    assert loading.resolve_dtype("auto", CUDA) == torch.bfloat16
    assert resolve_sampling_dtype("float16", torch.bfloat16, CUDA) == torch.float16
    assert resolve_sampling_dtype("auto", torch.float16, CUDA) == torch.float16
    assert resolve_sampling_dtype("auto", torch.bfloat16, CUDA) == torch.bfloat16
