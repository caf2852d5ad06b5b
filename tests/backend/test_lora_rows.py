"""The CPU's fused adapter kernel: it adds what the products in float64 add, within one bf16
rounding; a row's result is the same alone and beside other adapters' rows; where it cannot be
built (no compiler, a failing one, a cache others may write) the reason says so; the setting
turns it on and off in a bf16 sampler."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tinker import types

from runners.engine.sample import lora_rows
from runners.engine.sample import scheduler as engine
from runners.engine.sample.packed_model import PackedModel
from tests.backend.test_local_backend import prompt
from tests.support.local_backend import local_service


@pytest.fixture(scope="module")
def kernel() -> lora_rows.LoraRows:
    built = lora_rows.kernel()
    if built is None:
        pytest.skip("no C compiler here to build the kernel (the torch products serve)")
    return built


def _case(rows: int, inputs: int, out: int, slots: int, width: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inputs, generator=gen).bfloat16()
    y = torch.randn(rows, out, generator=gen).bfloat16()
    a = (torch.randn(slots, width, inputs, generator=gen) * 0.05).bfloat16()
    b = (torch.randn(slots, width, out, generator=gen) * 0.05).bfloat16()
    return x, y, a, b


def _expected(x, y, a, b, slot: list[int], used: int) -> torch.Tensor:
    want = y.double()
    for r, s in enumerate(slot):
        if s >= 0:
            want[r] += (x[r].double() @ a[s, :used].double().t()) @ b[s, :used].double()
    return want


@pytest.mark.parametrize(
    ("rows", "inputs", "out", "used"),
    [(1, 64, 64, 8), (9, 576, 960, 24), (13, 100, 130, 5), (64, 1536, 576, 8)],
)
def test_the_kernel_adds_each_rows_own_slot(kernel, rows, inputs, out, used):
    """Slots interleaved, base-model rows (-1), ranks below the slots' width, outputs and
    inputs that are not multiples of the kernel's blocks."""
    slots, width = 5, 24
    x, y, a, b = _case(rows, inputs, out, slots, width, seed=rows)
    slot = [(r * 3) % (slots + 1) - 1 for r in range(rows)]
    got = y.clone()
    kernel.add(x, got, a, b, torch.tensor(slot), used, threads=2)
    want = _expected(x, y, a, b, slot, used)
    # one bf16 rounding of the sum (round to nearest: half a unit in the last place)
    assert ((got.double() - want).abs() <= want.abs() * 2**-8 + 1e-30).all()
    untouched = [r for r, s in enumerate(slot) if s < 0]
    assert torch.equal(got[untouched], y[untouched])


@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_gets_the_same_bits_alone_and_beside_other_adapters(kernel, threads):
    """Whatever shares the call, and however many threads share its blocks."""
    x, y, a, b = _case(12, 576, 960, 4, 16, seed=7)
    slot = [r % 4 for r in range(12)]
    together = y.clone()
    kernel.add(x, together, a, b, torch.tensor(slot), 16, threads)
    for r in range(12):
        alone = y[r : r + 1].clone()
        kernel.add(x[r : r + 1], alone, a, b, torch.tensor([slot[r]]), 16)
        assert torch.equal(alone[0], together[r])


def test_wrong_shapes_or_dtypes_are_refused_before_the_c_side(kernel):
    x, y, a, b = _case(4, 64, 64, 2, 8, seed=1)
    slot = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="not the shapes"):
        kernel.add(x.float(), y, a, b, slot, 8)
    with pytest.raises(ValueError, match="not the shapes"):
        kernel.add(x, y[:, :32], a, b, slot, 8)
    with pytest.raises(ValueError, match="not the shapes"):
        kernel.add(x, y, a, b, slot, 9)
    with pytest.raises(ValueError, match="not the shapes"):
        kernel.add(x.t(), y, a, b, slot, 8)


def test_no_compiler_is_said(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert lora_rows.build(tmp_path / "k") == "no C compiler (cc, or $CC) on PATH"


def test_a_failing_compiler_is_said(tmp_path: Path, monkeypatch):
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'cc: error: this compiler refuses' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    reason = lora_rows.build(tmp_path / "k")
    assert reason == "cc failed on lora_rows.c: cc: error: this compiler refuses"
    assert not list((tmp_path / "k").iterdir())  # no partial library left


def test_a_cache_others_can_write_is_refused(tmp_path: Path):
    cache = tmp_path / "k"
    cache.mkdir()
    os.chmod(cache, 0o777)
    reason = lora_rows.build(cache)
    assert isinstance(reason, str) and "not this user's alone" in reason


def test_a_build_is_reused(kernel, tmp_path: Path):
    first = lora_rows.build(tmp_path / "k")
    assert isinstance(first, lora_rows.LoraRows)
    stamp = first.path.stat().st_mtime_ns
    again = lora_rows.build(tmp_path / "k")
    assert isinstance(again, lora_rows.LoraRows)
    assert again.path == first.path and first.path.stat().st_mtime_ns == stamp
    assert oct(first.path.parent.stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("wanted", [True, False])
def test_the_setting_reaches_a_bf16_samplers_model(tmp_path: Path, wanted: bool):
    """RLCS_CPU_ADAPTER_KERNEL (the service's `cpu_adapter_kernel`): on, a bf16 CPU sampler's
    packed model adds its updates through the kernel; off, through torch's products."""
    if wanted and lora_rows.kernel() is None:
        pytest.skip("no C compiler here to build the kernel")
    service = local_service(tmp_path, sampling_dtype="bfloat16", cpu_adapter_kernel=wanted)
    try:
        client = service.create_lora_training_client("tiny-random", rank=4, seed=1).result()
        sampler = client.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=3, seed=1, stop=[])
        assert len(sampler.sample(prompt([1, 2, 3]), 2, params).result(timeout=60).sequences) == 2
        model = engine.scheduler_for(client._host)._model
        assert isinstance(model, PackedModel)
        assert (model.kernel is not None) == wanted
    finally:
        service.close()
