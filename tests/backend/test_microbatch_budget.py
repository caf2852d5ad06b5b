"""The default training micro-batch budget: the rule on given devices and shapes (no GPU
needed), its activation estimate against what autograd keeps, and how it reaches a trainer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from peft.helpers import disable_input_dtype_casting
from pydantic import ValidationError
from transformers import LlamaConfig, Qwen2Config

from core.settings import Settings
from runners.engine.train.microbatch_budget import (
    MAX_BUDGET,
    SMALL_BUDGET,
    ModelShape,
    default_tokens_per_microbatch,
    model_shape,
)
from tests.support.local_backend import local_service

MIB = 1 << 20
H200 = 150_109_880_320  # torch.cuda.get_device_properties(0).total_memory on the lent H200
H100_80GB = 81_559 * MIB
GPU_24GB = 24_564 * MIB

SMOLLM2_135M = model_shape(
    LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
    ),
    torch.bfloat16,
)
QWEN2_1_5B = model_shape(
    Qwen2Config(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
    torch.bfloat16,
)
QWEN2_7B = model_shape(
    Qwen2Config(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
    ),
    torch.bfloat16,
)


def test_shapes_are_read_from_configs() -> None:
    assert QWEN2_1_5B == ModelShape(
        layers=28, hidden=1536, intermediate=8960, kv_dim=256, element_bytes=2
    )
    assert SMOLLM2_135M is not None and SMOLLM2_135M.kv_dim == 192
    assert model_shape(LlamaConfig(), torch.float32).element_bytes == 4  # type: ignore[union-attr]
    assert model_shape(object(), torch.bfloat16) is None  # no transformers fields


@pytest.mark.parametrize(
    ("device", "memory", "shape", "expected"),
    [
        ("cpu", None, QWEN2_1_5B, SMALL_BUDGET),
        ("cpu", H200, SMOLLM2_135M, SMALL_BUDGET),  # host memory never raises it
        ("cuda", None, QWEN2_1_5B, SMALL_BUDGET),
        ("cuda", H200, None, SMALL_BUDGET),
        ("cuda", GPU_24GB, QWEN2_1_5B, SMALL_BUDGET),
        ("cuda", GPU_24GB, SMOLLM2_135M, 8192),
        ("cuda", H100_80GB, QWEN2_1_5B, 8192),
        ("cuda", H200, QWEN2_7B, 8192),
        ("cuda", H200, QWEN2_1_5B, 16384),
        ("cuda", H200, SMOLLM2_135M, MAX_BUDGET),
    ],
)
def test_the_budget_follows_the_device_and_the_shape(
    device: str, memory: int | None, shape: ModelShape | None, expected: int
) -> None:
    assert default_tokens_per_microbatch(device, memory, shape) == expected


def test_the_budget_grows_with_memory_and_its_activations_stay_in_a_third() -> None:
    assert QWEN2_1_5B is not None
    per_token = QWEN2_1_5B.activation_bytes_per_token()
    previous = SMALL_BUDGET
    for gib in range(8, 400, 8):
        budget = default_tokens_per_microbatch("cuda", gib << 30, QWEN2_1_5B)
        assert budget >= previous and budget & (budget - 1) == 0
        assert SMALL_BUDGET <= budget <= MAX_BUDGET
        assert budget == SMALL_BUDGET or budget * per_token <= (gib << 30) / 3
        previous = budget
    assert previous == MAX_BUDGET
    float32 = dataclasses.replace(QWEN2_1_5B, element_bytes=4)
    assert default_tokens_per_microbatch("cuda", H200, float32) == 8192  # twice the bytes


def _saved_bytes(model: torch.nn.Module, tokens: int) -> int:
    """Bytes of the tensors autograd keeps for backward in a decoder pass over `tokens`
    (parameters aside), as on CUDA: bf16 base, bf16 autocast, peft's input casts off."""
    sizes: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        sizes[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(3, 200, (2, tokens // 2), generator=torch.Generator().manual_seed(0))
    with (
        disable_input_dtype_casting(model),
        torch.autocast("cpu", dtype=torch.bfloat16),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
    ):
        model.get_decoder()(input_ids=ids, use_cache=False)
    return sum(n for ptr, n in sizes.items() if ptr not in params)


def test_the_activation_estimate_matches_what_autograd_keeps(tmp_path: Path) -> None:
    service = local_service(tmp_path, device="cpu", dtype="bfloat16")
    try:
        trainer = service.create_lora_training_client("tiny-random", rank=8, seed=0).result()
        with trainer._host.training(trainer._adapter) as model:
            per_token = (_saved_bytes(model, 512) - _saved_bytes(model, 256)) / 256
            shape = model_shape(model.config, torch.bfloat16)
        assert shape is not None
        # Within 20%: the estimate leaves out the embedding's and final norm's few per token.
        assert per_token == pytest.approx(shape.activation_bytes_per_token(), rel=0.2)
    finally:
        service.close()


def test_the_service_picks_the_default_unless_told(tmp_path: Path) -> None:
    for told, expected in ((None, SMALL_BUDGET), (1000, 1000)):
        service = local_service(tmp_path / str(told), device="cpu", tokens_per_microbatch=told)
        try:
            trainer = service.create_lora_training_client("tiny-random", rank=8).result()
            assert trainer._tokens_per_microbatch == expected
        finally:
            service.close()


def test_the_setting_reaches_runners_and_rejects_nonsense(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert "RLCS_TOKENS_PER_MICROBATCH" not in Settings().runner_variables()
    monkeypatch.setenv("RLCS_TOKENS_PER_MICROBATCH", "16384")
    settings = Settings()
    assert settings.tokens_per_microbatch == 16384
    assert settings.runner_variables()["RLCS_TOKENS_PER_MICROBATCH"] == "16384"
    monkeypatch.setenv("RLCS_TOKENS_PER_MICROBATCH", "0")
    with pytest.raises(ValidationError, match="tokens_per_microbatch"):
        Settings()
