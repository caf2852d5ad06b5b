"""The local backend on CUDA: captured decode steps (the transformers path and the packed
model, one step ahead), bf16 sampler against the bf16 trainer, min_tokens bans in captured
steps, chunked training logprobs, the float16 option (loss scaling, an fp16 sampler against
the fp16 trainer). Marked `gpu`; skipped where CUDA is not available.

Tolerances are those of bfloat16 (8 bits of mantissa): logprobs near -10 carry rounding of a
few hundredths, and a row's numbers depend on the kernels its batch size picks."""

from __future__ import annotations

import itertools
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from tinker import types

from runners.engine.sample import scheduler
from runners.engine.sample.packed_model import PackedModel
from runners.engine.sample.sampling_model import SamplingModel
from runners.engine.sample.slot_batch import SlotBatch
from runners.engine.sample.slot_cache import AdapterIndex, SlotCache
from tests.backend.test_local_backend import ADAM, ce_batch, ce_datum, prompt, train_steps
from tests.backend.test_slot_batch import SPECS, _drain, _rows
from tests.support.local_backend import local_service

BF16_LOGPROB_ATOL = 0.1
# Steps small enough that tiny-random's gradients hardly grow: a settled loss scale holds.
SMALL_ADAM = types.AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-8)


@pytest.fixture
def cuda_trainer(tmp_path: Path):
    service = local_service(tmp_path, device="cuda", dtype="auto", sampling_dtype="auto")
    trainer = service.create_lora_training_client("tiny-random", rank=8, seed=0).result()
    yield service, trainer
    service.close()


@pytest.fixture
def fp16_trainer(tmp_path: Path):
    """RLCS_DTYPE=float16 with the sampler's `auto`: fp16 on both sides."""
    service = local_service(tmp_path, device="cuda", dtype="float16", sampling_dtype="auto")
    trainer = service.create_lora_training_client("tiny-random", rank=8, seed=0).result()
    yield service, trainer
    service.close()


def _slot_batch(model, trainer, graphs: bool) -> SlotBatch:
    return SlotBatch(
        model,
        slots=8,
        pad_id=0,
        device=torch.device("cuda"),
        decode=trainer.get_tokenizer().decode,
        max_positions=None,
        graphs=graphs,
    )


def test_captured_steps_replay_what_eager_steps_compute(cuda_trainer):
    _, trainer = cuda_trainer
    train_steps(trainer, ce_batch(trainer), 3)
    copy = SamplingModel(trainer._host, torch.bfloat16)
    copy.load(0, trainer._host.snapshot())
    _assert_graphs_replay_eager(copy.module, trainer, lambda: _rows(SPECS))


def _assert_graphs_replay_eager(model, trainer, rows) -> None:
    """The same rows decoded eagerly and through captured CUDA graphs: the same tokens, and
    logprobs to 1e-3."""
    eager, graphed = rows(), rows()
    _drain(_slot_batch(model, trainer, graphs=False), eager)
    batch = _slot_batch(model, trainer, graphs=True)
    _drain(batch, graphed)
    assert batch.captures >= 1
    for a, b in zip(eager, graphed, strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-3)


def test_a_weight_update_reaches_captured_graphs_without_recapture(cuda_trainer):
    _, trainer = cuda_trainer
    copy = SamplingModel(trainer._host, torch.bfloat16)
    batch = _slot_batch(copy.module, trainer, graphs=True)
    copy.load(0, trainer._host.snapshot())
    before = _rows(SPECS, temperature=0.0)
    _drain(batch, before)
    captures = batch.captures
    train_steps(trainer, ce_batch(trainer), 5)
    copy.load(0, trainer._host.snapshot())
    after, eager = _rows(SPECS, temperature=0.0), _rows(SPECS, temperature=0.0)
    _drain(batch, after)
    _drain(_slot_batch(copy.module, trainer, graphs=False), eager)
    assert batch.captures == captures
    assert [r.tokens for r in after] == [r.tokens for r in eager]
    assert [r.tokens for r in after] != [r.tokens for r in before]


def test_a_longer_row_recaptures_on_a_new_cache(cuda_trainer):
    """A row longer than the cache holds sizes a new one, which drops the graphs and their
    memory pool: the next capture takes a fresh pool (CUDA refuses one whose graphs are
    gone) and replays what eager steps compute."""
    _, trainer = cuda_trainer
    copy = SamplingModel(trainer._host, torch.float32)
    copy.load(0, trainer._host.snapshot())
    batch = _slot_batch(copy.module, trainer, graphs=True)
    _drain(batch, _rows(SPECS, temperature=0.0))
    captures = batch.captures
    long_specs = [(p * 80, n, seed) for p, n, seed in SPECS]
    graphed, eager = _rows(long_specs, temperature=0.0), _rows(long_specs, temperature=0.0)
    _drain(batch, graphed)
    _drain(_slot_batch(copy.module, trainer, graphs=False), eager)
    assert batch.captures > captures
    assert [r.tokens for r in graphed] == [r.tokens for r in eager]


def test_cuda_sampler_logprobs_agree_with_the_trainer(cuda_trainer):
    _, trainer = cuda_trainer
    train_steps(trainer, ce_batch(trainer), 3)
    sampler = trainer.save_weights_and_get_sampling_client().result()
    assert isinstance(scheduler.scheduler_for(trainer._host)._batch, type(None) | SlotBatch)
    tokens = trainer.get_tokenizer().encode("on the gpu")
    params = types.SamplingParams(max_tokens=24, temperature=1.0, seed=3, stop=[])
    sequences = sampler.sample(prompt(tokens), 8, params).result().sequences
    assert isinstance(scheduler.scheduler_for(trainer._host)._batch, SlotBatch)
    out = trainer.forward([ce_datum(tokens + s.tokens) for s in sequences], "cross_entropy")
    worst = 0.0
    for record, seq in zip(out.result().loss_fn_outputs, sequences, strict=True):
        diff = np.abs(record["logprobs"].to_numpy()[-len(seq.logprobs) :] - seq.logprobs)
        worst = max(worst, float(diff.max()))
    print(f"max |sampler - trainer| logprob on CUDA bf16: {worst:.4f}")
    assert worst < BF16_LOGPROB_ATOL


def test_reloaded_weights_on_the_same_device_give_identical_samples(cuda_trainer, tmp_path):
    service, trainer = cuda_trainer
    train_steps(trainer, ce_batch(trainer), 3)
    saved = trainer.save_weights_for_sampler("step-3").result()
    in_memory = trainer.save_weights_and_get_sampling_client().result()
    tokens = trainer.get_tokenizer().encode("reload")
    params = types.SamplingParams(max_tokens=10, temperature=1.0, seed=7, stop=[])
    want = in_memory.sample(prompt(tokens), 3, params).result().sequences
    reloaded = trainer.create_sampling_client(saved.path).result()
    got = reloaded.sample(prompt(tokens), 3, params).result().sequences
    assert [s.tokens for s in got] == [s.tokens for s in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.logprobs, w.logprobs)


def test_bf16_training_logprobs_match_a_full_logits_pass(cuda_trainer):
    _, trainer = cuda_trainer
    train_steps(trainer, ce_batch(trainer), 2)
    data = ce_batch(trainer)
    out = trainer.forward(data, "cross_entropy").result().loss_fn_outputs
    model = trainer._host.model
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for record, datum in zip(out, data, strict=True):
            ids = torch.tensor([datum.model_input.to_ints()], device="cuda")
            targets = datum.loss_fn_inputs["target_tokens"].to_torch().cuda()
            logits = model(input_ids=ids).logits[0].float()
            want = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
            np.testing.assert_allclose(
                record["logprobs"].to_numpy(), want.cpu().numpy(), atol=BF16_LOGPROB_ATOL
            )


def test_buckets_are_captured_while_the_trainer_trains_on_another_thread(cuda_trainer):
    """Sampling takes no host lock, so a new bucket's graph may be captured while the trainer
    runs: neither side may fail, and the samples stay those of the snapshot."""
    _, trainer = cuda_trainer
    data = ce_batch(trainer)
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokens = trainer.get_tokenizer().encode("side by side")
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=5, stop=[])
    want = [sampler.sample(prompt(tokens), n, params).result().sequences for n in (3, 5)]
    trainer._host.close()  # a fresh scheduler: every bucket is captured again below
    stop, errors, steps = threading.Event(), [], []

    def train() -> None:
        try:
            while not stop.is_set():
                trainer.forward_backward(data, "cross_entropy")
                steps.append(trainer.optim_step(ADAM).result(timeout=120))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=train)
    thread.start()
    try:
        got = [sampler.sample(prompt(tokens), n, params).result().sequences for n in (3, 5)]
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not errors and steps
    batch = scheduler.scheduler_for(trainer._host)._batch
    assert isinstance(batch, SlotBatch) and batch.captures >= 2
    for a, b in zip(want, got, strict=True):
        assert [s.tokens for s in a] == [s.tokens for s in b]


def test_two_slot_batches_capture_on_two_threads_as_each_alone(cuda_trainer):
    """A host holding two bases runs a scheduler thread for each: their slot batches capture
    graphs at the same moments (every bucket of a fresh batch), and each samples what it
    samples alone (float32: a row's numbers do not hang on its batch's kernels)."""
    _, trainer = cuda_trainer
    train_steps(trainer, ce_batch(trainer), 3)
    models = [_packed(trainer, torch.float32), _packed(trainer, torch.float32)]
    greedy = {"temperature": 0.0}
    alone = [_on(0, **greedy) for _ in models]
    for model, rows in zip(models, alone, strict=True):
        _drain(_slot_batch(model, trainer, graphs=True), rows)

    def drain(model, rows, start: threading.Barrier) -> int:
        batch = _slot_batch(model, trainer, graphs=True)
        start.wait(timeout=60)
        _drain(batch, rows)
        return batch.captures

    for _ in range(4):  # fresh batches: every round captures every bucket again on both
        together = [_on(0, **greedy) for _ in models]
        start = threading.Barrier(2)
        with ThreadPoolExecutor(2) as pool:
            captures = list(pool.map(drain, models, together, [start, start]))
        assert min(captures) >= 1
        for a, b in zip(alone, together, strict=True):
            assert [r.tokens for r in a] == [r.tokens for r in b]


def _packed(trainer, dtype: torch.dtype = torch.bfloat16, **options) -> PackedModel:
    """The packed model, the trainer's adapter in slot 0 (rows on slot 0: `_on`)."""
    packed = PackedModel(trainer._host, dtype, **options)
    packed.load(0, trainer._host.snapshot())
    return packed


def _on(slot: int, **settings) -> list:
    return _rows(SPECS, adapter_slot=slot, **settings)


def test_packed_captured_steps_one_ahead_replay_what_eager_steps_compute(cuda_trainer):
    """The packed model under captured graphs, each step's tokens read while the next runs,
    against the same steps run eagerly and read at once."""
    _, trainer = cuda_trainer
    train_steps(trainer, ce_batch(trainer), 3)
    packed = _packed(trainer)
    eager, graphed = _on(0), _on(0)
    _drain(_slot_batch(packed, trainer, graphs=False), eager)
    batch = _slot_batch(packed, trainer, graphs=True)
    assert batch._ahead
    _drain(batch, graphed)
    assert batch.captures >= 1
    for a, b in zip(eager, graphed, strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-3)


def test_packed_graphs_follow_a_new_adapter_and_the_base_model(cuda_trainer):
    _, trainer = cuda_trainer
    packed = _packed(trainer)
    batch = _slot_batch(packed, trainer, graphs=True)
    before = _on(0, temperature=0.0)
    _drain(batch, before)
    captures = batch.captures
    train_steps(trainer, ce_batch(trainer), 5)
    packed.load(0, trainer._host.snapshot())
    after, eager = _on(0, temperature=0.0), _on(0, temperature=0.0)
    _drain(batch, after)
    _drain(_slot_batch(packed, trainer, graphs=False), eager)
    assert batch.captures == captures  # same tensors, new numbers: no capture
    assert [r.tokens for r in after] == [r.tokens for r in eager]
    assert [r.tokens for r in after] != [r.tokens for r in before]
    base = _on(-1, temperature=0.0)  # the base model: a graph of its own (no adapter products)
    _drain(batch, base)
    assert batch.captures > captures


def test_packed_bf16_logits_stay_close_to_the_bf16_trainer(cuda_trainer):
    _, trainer = cuda_trainer
    train_steps(trainer, ce_batch(trainer), 3)
    packed = _packed(trainer)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4]], device="cuda")
    cache = SlotCache(torch.zeros(1, 1, dtype=torch.long, device="cuda"), 256)
    packed.allocate(cache, 1)
    slots, last = torch.tensor([0], device="cuda"), torch.tensor([7], device="cuda")
    with torch.no_grad():
        on = AdapterIndex.of([0], torch.device("cuda"))
        logits = packed.prefill(ids, torch.ones_like(ids), last, cache, slots, on)
        with torch.autocast("cuda", dtype=torch.bfloat16):  # as the trainer computes
            want = trainer._host.model(input_ids=ids).logits[0, -1]
    got = torch.log_softmax(logits[0].float(), -1)
    np.testing.assert_allclose(
        got.cpu().numpy(), torch.log_softmax(want.float(), -1).cpu().numpy(), atol=BF16_LOGPROB_ATOL
    )


def test_min_tokens_bans_stop_ids_in_captured_steps(cuda_trainer):
    _, trainer = cuda_trainer
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokens = trainer.get_tokenizer().encode("min tokens")
    greedy = types.SamplingParams(max_tokens=8, temperature=0.0, stop=[])
    first = sampler.sample(prompt(tokens), 1, greedy).result().sequences[0].tokens[0]
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=2, stop=[first])
    held = sampler.sample(prompt(tokens), 4, params, min_tokens=6).result().sequences
    assert all(first not in s.tokens[:6] and len(s.tokens) >= 6 for s in held)


def test_mixed_adapters_in_captured_steps_equal_each_alone(cuda_trainer):
    """Rows of two adapters of different ranks and of the base model in one captured step
    (the masked route) sample what each samples alone, and what the CPU's route (apart,
    eager) samples on the GPU; a larger rank grows the slots, and the graphs follow. In
    float32, where a row's numbers do not hang on its batch's kernels."""
    service, trainer = cuda_trainer
    train_steps(trainer, ce_batch(trainer), 3)
    other = service.create_lora_training_client("tiny-random", rank=4, seed=3).result()
    train_steps(other, ce_batch(other), 3)
    wide = service.create_lora_training_client("tiny-random", rank=16, seed=4).result()
    train_steps(wide, ce_batch(wide), 3)
    packed = _packed(trainer, torch.float32, slots=4)
    packed.load(1, other._host.snapshot())
    greedy = {"temperature": 0.0}

    def mixed() -> list:
        return [*_on(0, **greedy), *_on(1, **greedy), *_on(-1, **greedy)]

    together = mixed()
    batch = _slot_batch(packed, trainer, graphs=True)
    _drain(batch, together)
    for slot, rows in ((0, together[:3]), (1, together[3:6]), (-1, together[6:])):
        alone = _on(slot, **greedy)
        _drain(_slot_batch(packed, trainer, graphs=True), alone)
        assert [r.tokens for r in alone] == [r.tokens for r in rows]
    apart = _packed(trainer, torch.float32, slots=4, masked=False)
    apart.load(1, other._host.snapshot())
    eager = mixed()
    _drain(_slot_batch(apart, trainer, graphs=False), eager)
    assert [r.tokens for r in eager] == [r.tokens for r in together]
    layout, captures = packed.layout, batch.captures
    packed.load(2, wide._host.snapshot())  # rank 16: wider slots, new tensors
    assert packed.layout > layout
    grown = [*mixed(), *_on(2, **greedy)]
    _drain(batch, grown)
    assert batch.captures > captures
    assert [r.tokens for r in grown[:9]] == [r.tokens for r in together]


def test_two_training_lanes_on_one_gpu_train_as_each_alone(tmp_path: Path):
    """Two clients' passes side by side on one GPU (a thread each, on lanes over the same
    weights) give each the losses it gets alone (float32, where kernels do not vary by batch)."""
    from tests.backend.test_shared_base import steps

    def losses(lanes: int, together: bool) -> list[list[float]]:
        service = local_service(
            tmp_path / f"{lanes}-{together}", device="cuda", training_lanes=lanes
        )
        try:
            clients = [
                service.create_lora_training_client("tiny-random", rank=8, seed=s).result()
                for s in (1, 2)
            ]
            if not together:
                return [steps(c, 3) for c in clients]
            assert clients[0]._host.lane != clients[1]._host.lane
            with ThreadPoolExecutor(2) as pool:
                return list(pool.map(lambda c: steps(c, 3), clients))
        finally:
            service.close()

    alone, side_by_side = losses(1, together=False), losses(2, together=True)
    for got, want in zip(side_by_side, alone, strict=True):
        assert got == pytest.approx(want, rel=1e-4)


# ----- the float16 option -------------------------------------------------------------------


def _adapter(trainer) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in trainer.adapter_tensors().items()}


def _head_input_dtypes(trainer, data: list[types.Datum]) -> set[torch.dtype]:
    """The dtypes the unembedding's input has in a training forward pass."""
    seen: set[torch.dtype] = set()
    head = trainer._host.model.get_output_embeddings()
    hook = head.register_forward_pre_hook(lambda _, args: seen.add(args[0].dtype))
    try:
        trainer.forward(data, "cross_entropy").result()
    finally:
        hook.remove()
    return seen


def _skips(metrics: list[dict[str, float]]) -> list[bool]:
    """Which steps were skipped, from the running count each step reports."""
    counts = [0.0, *(m["skipped_steps"] for m in metrics)]
    return [after > before for before, after in itertools.pairwise(counts)]


def test_fp16_training_scales_its_loss_trains_and_settles(fp16_trainer):
    """An fp16 base trains its float32 adapter under fp16 autocast with a dynamic loss scale:
    the steps change the weights, and once one is taken none is skipped."""
    _, trainer = fp16_trainer
    model = trainer._host.model
    assert model.get_output_embeddings().weight.dtype == torch.float16
    assert all(p.dtype == torch.float32 for p in trainer._host.params.values())
    assert trainer._loss_scale is not None
    before, data = _adapter(trainer), ce_batch(trainer)
    # Under fp16 autocast the residual stream stays fp16 up to the head; under bf16 autocast
    # on an fp16 base it would mix into float32.
    assert _head_input_dtypes(trainer, data) == {torch.float16}
    metrics, losses = [], []
    for _ in range(8):
        out = trainer.forward_backward(data, "cross_entropy")
        metrics.append(trainer.optim_step(SMALL_ADAM).result().metrics)
        losses.append(out.result().metrics["loss:sum"])
    skipped = _skips(metrics)
    print("fp16 loss scales", [m["loss_scale"] for m in metrics], "skipped", skipped)
    taken = skipped.index(False)  # raises if every step was skipped
    assert taken <= 3 and not any(skipped[taken:])
    scales = [m["loss_scale"] for m in metrics]
    assert all(math.log2(s).is_integer() for s in scales) and scales == sorted(scales, reverse=True)
    assert all(
        math.isfinite(m["grad_norm"]) for m, skip in zip(metrics, skipped, strict=True) if not skip
    )
    after = _adapter(trainer)
    assert all(torch.isfinite(t).all() for t in after.values())
    assert any(not torch.equal(after[n], before[n]) for n in before)
    assert losses[-1] < losses[taken]


def _sampler_gaps(trainer) -> np.ndarray:
    """|sampler - trainer| logprob of every token the trainer's sampler draws (8 x 24)."""
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokens = trainer.get_tokenizer().encode("on the gpu")
    params = types.SamplingParams(max_tokens=24, temperature=1.0, seed=3, stop=[])
    sequences = sampler.sample(prompt(tokens), 8, params).result().sequences
    out = trainer.forward([ce_datum(tokens + s.tokens) for s in sequences], "cross_entropy")
    return np.concatenate(
        [
            np.abs(record["logprobs"].to_numpy()[-len(seq.logprobs) :] - seq.logprobs)
            for record, seq in zip(out.result().loss_fn_outputs, sequences, strict=True)
        ]
    )


def test_fp16_sampler_agrees_with_the_fp16_trainer_at_least_as_closely_as_bf16(tmp_path: Path):
    """The same adapter training (seed, data, steps) in bf16 and in fp16, each pair's sampler
    against its own trainer on the tokens it drew: fp16 (10 mantissa bits against 7) should
    come closer, the point of the option (arXiv 2510.26788)."""
    gaps: dict[str, np.ndarray] = {}
    for dtype in ("bfloat16", "float16"):
        service = local_service(tmp_path / dtype, device="cuda", dtype=dtype, sampling_dtype="auto")
        try:
            trainer = service.create_lora_training_client("tiny-random", rank=8, seed=0).result()
            train_steps(trainer, ce_batch(trainer), 3)
            gaps[dtype] = _sampler_gaps(trainer)
            copy = scheduler.scheduler_for(trainer._host)._model
            assert copy is not None and copy.dtype == getattr(torch, dtype)
        finally:
            service.close()
    for dtype, gap in gaps.items():
        print(f"{dtype} sampler vs trainer: mean |d| {gap.mean():.2e}, max {gap.max():.2e}")
    assert gaps["float16"].mean() <= gaps["bfloat16"].mean()
    assert gaps["float16"].max() < BF16_LOGPROB_ATOL


def test_fp16_packed_captured_steps_replay_what_eager_steps_compute(fp16_trainer):
    _, trainer = fp16_trainer
    train_steps(trainer, ce_batch(trainer), 3)
    _assert_graphs_replay_eager(_packed(trainer, torch.float16), trainer, lambda: _on(0))


def test_an_fp16_overflow_skips_the_step_and_lowers_the_scale(fp16_trainer):
    """A scale no fp16 gradient survives: the step is skipped, its scale halved, the adapter
    and AdamW's state left as they were (no inf or nan written); the next step trains."""
    _, trainer = fp16_trainer
    data = ce_batch(trainer)
    trainer.forward_backward(data, "cross_entropy")
    trainer.optim_step(SMALL_ADAM).result()
    before, scale = _adapter(trainer), trainer._loss_scale
    skipped, adam_steps = scale.skipped_steps, _adam_steps(trainer)
    scale.scale = 2.0**40
    trainer.forward_backward(data, "cross_entropy")
    metrics = trainer.optim_step(SMALL_ADAM).result().metrics
    print("forced overflow:", metrics)
    assert metrics["loss_scale"] == 2.0**40 and metrics["skipped_steps"] == skipped + 1
    assert math.isnan(metrics["grad_norm"])
    assert scale.scale == 2.0**39
    after = _adapter(trainer)
    assert all(torch.equal(after[n], before[n]) for n in before)
    assert _adam_steps(trainer) == adam_steps
    scale.scale = 2.0**4
    trainer.forward_backward(data, "cross_entropy")
    metrics = trainer.optim_step(SMALL_ADAM).result().metrics
    assert metrics["skipped_steps"] == skipped + 1 and math.isfinite(metrics["grad_norm"])
    after = _adapter(trainer)
    assert all(torch.isfinite(t).all() for t in after.values())
    assert any(not torch.equal(after[n], before[n]) for n in before)


def _adam_steps(trainer) -> list[float]:
    """AdamW's step count per parameter (a skipped step must not advance it)."""
    return [float(state["step"]) for state in trainer._optimizer.state.values()]
