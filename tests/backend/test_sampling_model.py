"""The sampler's copy of the model: same logits as the trainer's peft model in float32, in-place
adapter loads, shared or cast base weights, and bfloat16 sampling within bf16 tolerance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tinker import types

from runners.engine.local import LocalServiceClient
from runners.engine.sample.sampling_model import (
    SamplingModel,
    next_token_logits,
    resolve_sampling_dtype,
)
from tests.backend.test_local_backend import ce_batch, ce_datum, prompt, train_steps
from tests.support.local_backend import local_service


def _nudge(trainer) -> None:
    """A clearly non-zero adapter (peft starts B at zero, so a fresh adapter changes nothing)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in trainer._host.params.values():
            p.add_(torch.randn(p.shape, generator=generator).to(p.device) * 0.05)


def test_float32_copy_matches_the_peft_model_and_shares_its_base(trainer):
    _nudge(trainer)
    host = trainer._host
    copy = SamplingModel(host, torch.float32)
    assert copy.shares_weights and len(copy.lora) > 0
    base_ptrs = {p.data_ptr() for n, p in host.model.named_parameters() if "lora_" not in n}
    assert {p.data_ptr() for p in copy.module.parameters()} <= base_ptrs
    ids = torch.tensor([[1, 5, 9, 2, 7]], device=host.device)
    with torch.no_grad():
        copy.load(0, host.snapshot())
        torch.testing.assert_close(
            copy.module(input_ids=ids).logits, host.model(input_ids=ids).logits, atol=1e-5, rtol=0
        )
        copy.load(0, None)  # the base model alone
        with host.model.disable_adapter():
            want = host.model(input_ids=ids).logits
        torch.testing.assert_close(copy.module(input_ids=ids).logits, want, atol=1e-5, rtol=0)
    # The trainer's adapter still trains: building the copy changed none of its flags.
    assert all(p.requires_grad for p in host.params.values())


def test_loading_an_adapter_copies_in_place(trainer):
    host = trainer._host
    copy = SamplingModel(host, torch.float32)
    buffers = {n: b.data_ptr() for n, b in copy.module.named_buffers()}
    copy.load(0, host.snapshot())
    _nudge(trainer)
    copy.load(0, host.snapshot())
    assert {n: b.data_ptr() for n, b in copy.module.named_buffers()} == buffers


def test_bfloat16_copy_leaves_the_trainer_in_float32(trainer):
    host = trainer._host
    copy = SamplingModel(host, torch.bfloat16)
    assert not copy.shares_weights
    assert {p.dtype for p in copy.module.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in host.model.parameters()} == {torch.float32}


def test_next_token_logits_at_each_rows_last_position(trainer):
    _nudge(trainer)
    copy = SamplingModel(trainer._host, torch.float32)
    copy.load(0, trainer._host.snapshot())
    # Right-padded rows of lengths 5 and 3: each row's logits at its own last token.
    device = trainer._host.device
    ids = torch.tensor([[1, 5, 9, 2, 7], [4, 8, 3, 0, 0]], device=device)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], device=device)
    positions = torch.arange(5, device=device)[None].expand(2, 5)
    last = torch.tensor([4, 2], device=device)
    with torch.no_grad():
        got = next_token_logits(copy.module, ids, mask, positions, None, last)
        for row, length in ((0, 5), (1, 3)):
            want = copy.module(input_ids=ids[row : row + 1, :length]).logits[0, -1]
            torch.testing.assert_close(got[row], want, atol=1e-5, rtol=0)


def test_resolve_sampling_dtype():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_sampling_dtype("float32", torch.float32, cpu) == torch.float32
    assert resolve_sampling_dtype("auto", torch.bfloat16, cuda) == torch.bfloat16
    assert resolve_sampling_dtype("auto", torch.float32, cuda) == torch.float32
    auto_cpu = resolve_sampling_dtype("auto", torch.float32, cpu)
    assert auto_cpu in (torch.float32, torch.bfloat16)


def test_bfloat16_sampling_logprobs_stay_close_to_float32_training(tmp_path: Path):
    """What `auto` gives on a CPU with bf16: logprobs within bf16 rounding of the trainer's."""
    service = local_service(tmp_path, sampling_dtype="bfloat16")
    try:
        trainer = service.create_lora_training_client("tiny-random", rank=8, seed=0).result()
        train_steps(trainer, ce_batch(trainer), 3)
        sampler = trainer.save_weights_and_get_sampling_client().result()
        tokens = trainer.get_tokenizer().encode("bf16 sampling")
        params = types.SamplingParams(max_tokens=16, temperature=1.0, seed=3, stop=[])
        sequences = sampler.sample(prompt(tokens), 4, params).result().sequences
        data = [ce_datum(tokens + s.tokens) for s in sequences]
        out = trainer.forward(data, "cross_entropy").result().loss_fn_outputs
        diffs = [
            np.abs(o["logprobs"].to_numpy()[-len(s.logprobs) :] - np.asarray(s.logprobs))
            for o, s in zip(out, sequences, strict=True)
        ]
        worst = max(float(d.max()) for d in diffs)
        # bf16 keeps 8 bits of mantissa: logprobs near -5 move by up to a few hundredths.
        assert worst < 0.1, worst
        assert worst > 0.0  # it did sample in bf16 (float32 would agree to ~1e-6)
    finally:
        service.close()


@pytest.mark.parametrize("requested", ["float32", "bfloat16"])  # float16: CUDA only
def test_sampling_dtype_is_checked(tmp_path: Path, requested: str):
    service = LocalServiceClient(
        checkpoint_dir=tmp_path, models_dir=tmp_path, device="cpu", sampling_dtype=requested
    )
    service.close()
    with pytest.raises(ValueError, match="dtype must be one of"):
        LocalServiceClient(
            checkpoint_dir=tmp_path, models_dir=tmp_path, device="cpu", sampling_dtype="int8"
        )
