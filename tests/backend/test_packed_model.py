"""The sampler's packed forward: the same logits as the trainer's peft model in float32 (prefill
and decode, with an adapter and without, llama, qwen2 and qwen3 shapes), adapters loaded in
place, slot batches on it sampling what the transformers path samples, one step ahead or not,
and models it cannot pack left to that path (SmolLM2 itself: tests/backend/slow/)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tinker import types

from runners.engine import lora
from runners.engine.host import ModelHost
from runners.engine.sample import packed_group
from runners.engine.sample import scheduler as engine
from runners.engine.sample.batch import Row
from runners.engine.sample.dynamic_batch import DynamicCacheBatch
from runners.engine.sample.packed_model import PackedModel, packable
from runners.engine.sample.sampling_model import SamplingModel
from runners.engine.sample.slot_batch import SlotBatch
from runners.engine.sample.slot_cache import AdapterIndex, SlotCache
from runners.models.tiny import build_tiny_tokenizer

ATOL = 2e-5  # float32 rounding of a different but equivalent order of operations


def _nudge(host: ModelHost, seed: int = 0) -> None:
    """A clearly non-zero adapter (peft starts B at zero, so a fresh one changes nothing)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in host.params.values():
            p.add_(torch.randn(p.shape, generator=generator).to(p.device) * 0.05)


def _tiny_host(model_type: str, *, adapter: bool = True, **extra) -> ModelHost:
    """A random two-layer model of `model_type` (grouped heads, and its own quirks: qwen2's
    q/k/v biases, qwen3's per-head norms), LoRA on every linear layer when `adapter`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = build_tiny_tokenizer()
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    config = AutoConfig.for_model(model_type, **{**shape, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    if adapter:
        spec = lora.LoraSpec(rank=4)
        model = lora.wrap_with_config(model, lora.lora_config(model, spec, model_type), 0)
    host = ModelHost(model_type, model, tokenizer)
    _nudge(host)
    return host


def _reference(host: ModelHost, ids: list[int], adapter: bool) -> torch.Tensor:
    """The trainer's model's logits at the last position of `ids`."""
    batch = torch.tensor([ids], device=host.device)
    with torch.no_grad():
        if adapter or not host.is_lora:
            return host.model(input_ids=batch).logits[0, -1]
        with host.model.disable_adapter():
            return host.model(input_ids=batch).logits[0, -1]


def _check_against_reference(
    host: ModelHost,
    adapter: bool,
    atol: float = ATOL,
    matrix_rotary: bool | None = None,
    packed: PackedModel | None = None,
    slot: int = 0,
) -> None:
    """Prefill and two decode steps of the packed model against the peft model, the host's
    adapter loaded into `slot` (or no adapter: every row on -1, the base model alone)."""
    packed = packed or PackedModel(host, torch.float32)
    if matrix_rotary is not None:
        packed.matrix_rotary = matrix_rotary
    on = slot if adapter else -1
    if adapter:
        packed.load(slot, host.snapshot())
    prompts = [[1, 5, 9, 2, 7], [4, 8, 3]]
    ids = torch.tensor([[1, 5, 9, 2, 7], [4, 8, 3, 0, 0]], device=host.device)
    mask = (ids > 0).long()
    positions = torch.zeros(4, 1, dtype=torch.long, device=host.device)
    cache = SlotCache(positions, 32)
    packed.allocate(cache, 4)
    slots = torch.tensor([2, 0], device=host.device)  # any free slots, in any order
    with torch.no_grad():
        both = AdapterIndex.of([on, on], host.device)
        logits = packed.prefill(ids, mask, torch.tensor([4, 2]), cache, slots, both)
        for row, tokens in enumerate(prompts):
            want = _reference(host, tokens, adapter)
            torch.testing.assert_close(logits[row], want, atol=atol, rtol=0)
        # Two decode steps: each row reads its own slot only, at its own position.
        nexts = [[3, 11], [6, 2]]
        for step in range(2):
            positions[2, 0], positions[0, 0] = 5 + step, 3 + step
            tokens = torch.zeros(3, 1, dtype=torch.long, device=host.device)
            tokens[2, 0], tokens[0, 0] = nexts[0][step], nexts[1][step]
            columns = 8 + step  # fewer columns than the cache holds, as on the CPU
            mask = torch.arange(columns, device=host.device)[None] <= positions[:3]
            rows = AdapterIndex.of([on, -1, on], host.device)  # slot 1 is free
            out = packed.decode(tokens, positions[:3], mask, cache.bucket(3), rows)
            for slot, row in ((2, 0), (0, 1)):
                seen = prompts[row] + nexts[row][: step + 1]
                want = _reference(host, seen, adapter)
                torch.testing.assert_close(out[slot], want, atol=atol, rtol=0)


@pytest.mark.parametrize("masked", [False, True], ids=["apart", "masked"])
@pytest.mark.parametrize("adapter", [True, False], ids=["adapter", "base"])
def test_packed_logits_equal_the_peft_model_in_float32(trainer, adapter, masked):
    """Both adapter routes (apart: the CPU's; masked: CUDA's, run eagerly here)."""
    _nudge(trainer._host)
    packed = PackedModel(trainer._host, torch.float32, masked=masked, slots=3)
    _check_against_reference(trainer._host, adapter, packed=packed, slot=1)


def test_the_rotary_products_cuda_uses_rotate_as_the_cpu_does(trainer):
    """Each position's rotation as a matrix (one batched product: CUDA's way) gives the same
    numbers as the CPU's elementwise rotary."""
    _nudge(trainer._host)
    _check_against_reference(trainer._host, adapter=True, matrix_rotary=True)
    _check_against_reference(trainer._host, adapter=True, matrix_rotary=False)


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [("qwen2", {}), ("qwen3", {}), ("llama", {"attention_bias": True, "mlp_bias": True})],
)
def test_other_llama_shaped_models_pack_exactly(model_type, extra):
    host = _tiny_host(model_type, **extra)
    assert packable(host) is None
    _check_against_reference(host, adapter=True)
    _check_against_reference(host, adapter=False)


def test_a_model_without_lora_packs_and_samples_its_base():
    host = _tiny_host("llama", adapter=False)
    packed = PackedModel(host, torch.float32)
    assert not any(g.rank for g in _groups(packed))  # no slot holds anything
    _check_against_reference(host, adapter=False)


@pytest.mark.parametrize("masked", [False, True], ids=["apart", "masked"])
def test_loading_an_adapter_copies_in_place_and_follows_it(trainer, masked):
    host = trainer._host
    packed = PackedModel(host, torch.float32, masked=masked, slots=2)
    before = host.snapshot()
    packed.load(0, before)  # the first load sizes the slots for rank 8
    layout = packed.layout
    pointers = [(g.weight.data_ptr(), g.a_t.data_ptr(), g.b_t.data_ptr()) for g in _groups(packed)]
    _nudge(host, seed=1)
    after = host.snapshot()
    for adapter in (before, after, None, after):
        packed.load(0, adapter)
        assert [
            (g.weight.data_ptr(), g.a_t.data_ptr(), g.b_t.data_ptr()) for g in _groups(packed)
        ] == pointers
        assert packed.slot_ranks[0] == (8 if adapter is not None else 0)
    assert packed.layout == layout  # captured graphs stay valid
    _check_against_reference(host, adapter=True, packed=packed)  # `after`: the host's now


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize(
    ("model_type", "extra"), [("llama", {}), ("qwen2", {}), ("llama", {"mlp_bias": True})]
)
@pytest.mark.parametrize("exact", [10**9, 0], ids=["float32 adapter", "sampling-dtype adapter"])
def test_onednn_packed_products_are_the_same_numbers(model_type, extra, exact, monkeypatch):
    """The CPU's oneDNN route (bf16 by default; float32 here, so it can be held to the peft
    model exactly): base, adapter (its float32 products for a few rows and its copies in the
    sampling dtype beyond), residual and bias, and an adapter loaded after another."""
    monkeypatch.setattr(packed_group, "EXACT_ADAPTER_OUTPUTS", exact)
    host = _tiny_host(model_type, **extra)
    threads = torch.get_num_threads()
    packed = PackedModel(host, torch.float32, onednn=True)
    assert packed.onednn
    _check_against_reference(host, adapter=False, packed=packed)
    _check_against_reference(host, adapter=True, packed=packed)
    _nudge(host, seed=2)
    _check_against_reference(host, adapter=True, packed=packed)  # its copies follow the load
    # A decode step runs its small operations on one thread, and gives the others back.
    assert torch.get_num_threads() == threads


def test_a_float32_head_brings_bf16_logits_nearer_the_trainers():
    """cast_lm_head_to_fp32: a bf16 copy's logits come from a float32 unembedding (and its
    adapter), so large logits are not rounded to bf16's 8 bits: nearer the float32 model's."""
    host = _tiny_host("llama")
    with torch.no_grad():  # logits of a trained model's size (tens), where bf16's spacing shows
        host.model.get_output_embeddings().weight.mul_(24.0)
    ids = [1, 5, 9, 2, 7]
    want = _reference(host, ids, adapter=True)

    def logits(fp32_head: bool) -> torch.Tensor:
        host.cast_lm_head_to_fp32 = fp32_head
        packed = PackedModel(host, torch.bfloat16, onednn=False)
        packed.load(0, host.snapshot())
        one = torch.tensor([ids], device=host.device)
        cache = SlotCache(torch.zeros(1, 1, dtype=torch.long, device=host.device), 16)
        packed.allocate(cache, 1)
        rows = AdapterIndex.of([0], host.device)
        with torch.no_grad():
            out = packed.prefill(one, torch.ones_like(one), torch.tensor([4]), cache,
                                 torch.tensor([0]), rows)  # fmt: skip
        return out[0]

    rounded, exact = logits(False), logits(True)
    assert rounded.dtype == torch.bfloat16 and exact.dtype == torch.float32
    assert float(want.abs().max()) > 8  # large enough for bf16 to round them coarsely

    # The logprobs, what a ratio reads: the rounded ones' error is the 8-bit spacing of the
    # largest logits, which a float32 head does not add.
    def error(logits: torch.Tensor) -> float:
        return float((logits.float().log_softmax(-1) - want.log_softmax(-1)).abs().mean())

    assert error(exact) < 0.5 * error(rounded), (error(exact), error(rounded))


def _groups(packed: PackedModel) -> list:
    groups = [g for layer in packed.layers for g in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    return [*groups, packed.head]


def test_models_it_cannot_pack_use_the_transformers_path(tmp_path: Path, monkeypatch):
    host = _tiny_host("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0)
    assert "sliding" in (packable(host) or "")
    with pytest.raises(ValueError, match="cannot be packed"):
        PackedModel(host, torch.float32)
    assert isinstance(engine.sampling_model(host, torch.float32), SamplingModel)


SPECS = [([5, 9, 2, 7, 1], 12, 3), ([4, 8], 20, 4), ([3, 3, 6], 7, 5)]


def _rows(**settings) -> list[Row]:
    """The SPECS rows, on adapter slot 0 unless told (`adapter_slot`)."""
    base = dict(temperature=1.0, top_k=0, top_p=1.0, stop_ids=frozenset(), stop_strings=())
    base.update({"adapter_slot": 0, **settings})
    return [Row(prompt=p, max_tokens=n, seed=seed, **base) for p, n, seed in SPECS]


def _slot_batch(model, trainer, ahead: bool = False, slots: int = 8) -> SlotBatch:
    return SlotBatch(
        model,
        slots=slots,
        pad_id=0,
        device=trainer._host.device,
        decode=trainer.get_tokenizer().decode,
        max_positions=None,
        graphs=True,  # on the CPU the step runs eagerly
        ahead=ahead,
    )


def _drain(batch, rows: list[Row]) -> None:
    batch.join(rows)
    while len(batch):
        batch.step()


@pytest.mark.parametrize(
    "settings",
    [{}, {"top_k": 5, "top_p": 0.8}, {"temperature": 0.0}],
    ids=["plain", "nucleus", "greedy"],
)
def test_packed_slot_batch_samples_what_the_transformers_batch_samples(trainer, settings):
    _nudge(trainer._host)
    snapshot = trainer._host.snapshot()
    reference = SamplingModel(trainer._host, torch.float32)
    reference.load(0, snapshot)
    packed = PackedModel(trainer._host, torch.float32)
    packed.load(0, snapshot)
    want, got = _rows(**settings), _rows(**settings)
    _drain(
        DynamicCacheBatch(
            reference.module,
            pad_id=0,
            device=trainer._host.device,
            decode=trainer.get_tokenizer().decode,
        ),
        want,
    )
    _drain(_slot_batch(packed, trainer), got)
    for a, b in zip(want, got, strict=True):
        assert a.tokens == b.tokens and a.stop_reason == b.stop_reason == "length"
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_one_step_ahead_changes_no_token_and_retires_rows_late(trainer):
    """Reading each step's tokens while the next runs: the same rows, tokens and logprobs; a
    row that stops early (a stop id) still ends where it should, with late joins."""
    _nudge(trainer._host)
    packed = PackedModel(trainer._host, torch.float32)
    packed.load(0, trainer._host.snapshot())

    def run(ahead: bool, stop_ids: frozenset[int]) -> list[Row]:
        batch = _slot_batch(packed, trainer, ahead=ahead, slots=4)
        first, second, third = _rows(stop_ids=stop_ids)
        batch.join([first])
        for _ in range(3):
            batch.step()
        batch.join([second, third])
        while len(batch):
            batch.step()
        return [first, second, third]

    stop = frozenset({run(False, frozenset())[1].tokens[4]})  # the second row's fifth token
    want, got = run(False, stop), run(True, stop)
    assert want[1].stop_reason == "stop" and len(want[1].tokens) <= 5
    for a, b in zip(want, got, strict=True):
        assert (a.tokens, a.stop_reason) == (b.tokens, b.stop_reason)
        # Ahead, a step attends over the whole cache (not just the columns rows reached).
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_a_row_samples_the_same_whatever_shares_its_batch(trainer):
    _nudge(trainer._host)
    packed = PackedModel(trainer._host, torch.float32)
    packed.load(0, trainer._host.snapshot())
    together = _rows()
    _drain(_slot_batch(packed, trainer), together)
    for i in range(len(SPECS)):
        alone = _rows()[i]
        _drain(_slot_batch(packed, trainer), [alone])
        assert alone.tokens == together[i].tokens
        np.testing.assert_allclose(alone.logprobs, together[i].logprobs, atol=1e-5)


def test_the_engine_samples_through_the_packed_model(trainer):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokens = trainer.get_tokenizer().encode("packed")
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=1, stop=[])
    sampler.sample(types.ModelInput.from_ints(tokens), 2, params).result(timeout=60)
    running = engine.scheduler_for(trainer._host)
    assert isinstance(running._sampling_model(), PackedModel)
    assert isinstance(running._batch, SlotBatch)
