"""Many adapters in one decode batch: rows of adapters of every LoRA shape (and of the base model)
in one forward pass give each row what it gets alone, both adapter routes; one scheduler and one
sampling copy per base whatever the shapes; a request on another adapter joins the running batch
instead of waiting for it; adapters that cannot load are refused; slots are evicted least
recently used, never while held, and last when a waiting request wants their adapter."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from tinker import types

from runners.engine.host import AdapterWeights, ModelHost
from runners.engine.local import LocalServiceClient, LocalTrainingClient
from runners.engine.sample import scheduler as engine
from runners.engine.sample.adapter_table import BASE, AdapterTable
from runners.engine.sample.packed_model import PackedModel
from runners.engine.sample.slot_cache import AdapterIndex, SlotCache
from tests.backend.test_local_backend import ce_batch, prompt, train_steps
from tests.backend.test_packed_model import (
    SPECS,
    _drain,
    _groups,
    _reference,
    _rows,
    _slot_batch,
)
from tests.support.local_backend import local_service, while_decoding

ATOL = 2e-5


@pytest.fixture
def shapes(service: LocalServiceClient) -> list[LocalTrainingClient]:
    """Three clients on tiny-random with three LoRA shapes: rank 4 everywhere, rank 2 on
    attention only, rank 8 everywhere; each trained a little (B no longer zero)."""
    clients = [
        service.create_lora_training_client("tiny-random", rank=4, seed=1).result(),
        service.create_lora_training_client(
            "tiny-random", rank=2, seed=2, train_mlp=False, train_unembed=False
        ).result(),
        service.create_lora_training_client("tiny-random", rank=8, seed=3).result(),
    ]
    for client in clients:
        train_steps(client, ce_batch(client), 2)
    return clients


@pytest.mark.parametrize("masked", [False, True], ids=["apart", "masked"])
def test_rows_of_every_shape_in_one_pass_equal_their_own_model(shapes, masked):
    """Prefill and decode steps over rows on slots 0, 1, 2 and the base model: each row's
    logits are its own peft model's (float32)."""
    hosts: list[ModelHost] = [c._host for c in shapes]
    packed = PackedModel(hosts[0], torch.float32, masked=masked, slots=3)
    for slot, host in enumerate(hosts):
        packed.load(slot, host.snapshot())
    device = hosts[0].device
    on = [0, 1, 2, -1]
    owner = [hosts[0], hosts[1], hosts[2], hosts[0]]
    prompts = [[1, 5, 9, 2, 7], [4, 8, 3], [6, 6, 2, 9], [2, 3]]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts], device=device)
    positions = torch.zeros(4, 1, dtype=torch.long, device=device)
    cache = SlotCache(positions, 32)
    packed.allocate(cache, 4)
    last = torch.tensor([len(p) - 1 for p in prompts])
    with torch.no_grad():
        logits = packed.prefill(
            ids, (ids > 0).long(), last, cache, torch.arange(4), AdapterIndex.of(on, device)
        )
        for row, tokens in enumerate(prompts):
            want = _reference(owner[row], tokens, adapter=on[row] >= 0)
            torch.testing.assert_close(logits[row], want, atol=ATOL, rtol=0)
        seen = [list(p) for p in prompts]
        for step in range(2):
            tokens = torch.tensor([[3 + step + row] for row in range(4)], device=device)
            for row in range(4):
                positions[row, 0] = len(seen[row])
                seen[row].append(int(tokens[row, 0]))
            columns = width + 2
            mask = torch.arange(columns, device=device)[None] <= positions
            out = packed.decode(
                tokens, positions, mask, cache.bucket(4), AdapterIndex.of(on, device)
            )
            for row in range(4):
                want = _reference(owner[row], seen[row], adapter=on[row] >= 0)
                torch.testing.assert_close(out[row], want, atol=ATOL, rtol=0)


def test_bf16_rows_through_the_fused_kernel_match_the_torch_products(shapes):
    """A bf16 copy on the CPU: mixed rows' prefill and decode logits through the fused kernel
    (lora_rows.py) are those of the torch products within bf16 rounding."""
    hosts: list[ModelHost] = [c._host for c in shapes]
    fused = PackedModel(hosts[0], torch.bfloat16, slots=3, kernel=True)
    if fused.kernel is None:
        pytest.skip("no C compiler here to build the kernel")
    plain = PackedModel(hosts[0], torch.bfloat16, slots=3, kernel=False)
    assert plain.kernel is None
    on = [2, 0, -1, 1, 0, 2]
    prompts = [[1, 5, 9, 2, 7], [4, 8, 3], [6, 6, 2, 9], [2, 3], [7, 1], [3, 3, 3]]
    results = []
    for packed in (fused, plain):
        for slot, host in enumerate(hosts):
            packed.load(slot, host.snapshot())
        results.append(_prefill_then_decode(packed, prompts, on))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got.float(), want.float(), atol=0.05, rtol=0.02)


def _prefill_then_decode(packed: PackedModel, prompts: list[list[int]], on: list[int]):
    """The prefill's last logits, then two decode steps' logits, of rows on slots `on`."""
    device = packed.device
    rows = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts], device=device)
    positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
    cache = SlotCache(positions, 32)
    packed.allocate(cache, rows)
    last = torch.tensor([len(p) - 1 for p in prompts])
    adapters = AdapterIndex.of(on, device)
    with torch.no_grad():
        out = [packed.prefill(ids, (ids > 0).long(), last, cache, torch.arange(rows), adapters)]
        lengths = [len(p) for p in prompts]
        for step in range(2):
            tokens = torch.tensor([[3 + step + row] for row in range(rows)], device=device)
            for row in range(rows):
                positions[row, 0] = lengths[row]
                lengths[row] += 1
            mask = torch.arange(width + 2, device=device)[None] <= positions
            out.append(packed.decode(tokens, positions, mask, cache.bucket(rows), adapters))
    return out


def test_a_row_samples_the_same_tokens_alone_and_in_a_mixed_batch(shapes):
    packed = PackedModel(shapes[0]._host, torch.float32, slots=3)
    for slot, client in enumerate(shapes):
        packed.load(slot, client._host.snapshot())
    slots = [0, 1, 2, -1]
    together = [row for slot in slots for row in _rows(adapter_slot=slot)]
    _drain(_slot_batch(packed, shapes[0]), together)
    for i, slot in enumerate(slots):
        for j in range(len(SPECS)):
            alone = _rows(adapter_slot=slot)[j]
            _drain(_slot_batch(packed, shapes[0]), [alone])
            mixed = together[i * len(SPECS) + j]
            assert alone.tokens == mixed.tokens
            np.testing.assert_allclose(alone.logprobs, mixed.logprobs, atol=1e-5)


def test_adapters_that_cannot_load_are_refused(shapes):
    host = shapes[0]._host
    packed = PackedModel(host, torch.float32, slots=2)
    snapshot = host.snapshot()
    foreign = AdapterWeights(
        {
            "base_model.model.encoder.block.0.q.lora_A.default.weight": torch.zeros(4, 8),
            "base_model.model.encoder.block.0.q.lora_B.default.weight": torch.zeros(8, 4),
        },
        scale=8.0,
        rank=4,
    )
    with pytest.raises(ValueError, match="trained on another base model"):
        packed.load(0, foreign)
    too_wide = AdapterWeights(snapshot.tensors, snapshot.scale, rank=host.max_lora_rank + 1)
    with pytest.raises(ValueError, match="RLCS_MAX_LORA_RANK"):
        packed.load(0, too_wide)
    assert packed.slot_ranks == [0, 0]  # nothing half-loaded


def test_a_rank_above_the_largest_is_refused_at_the_client(service):
    with pytest.raises(ValueError, match=r"lora_rank 256 .*RLCS_MAX_LORA_RANK"):
        service.create_lora_training_client("tiny-random", rank=256)


def test_samplers_of_every_shape_share_one_scheduler_and_one_copy(service, shapes):
    samplers = [c.save_weights_and_get_sampling_client().result() for c in shapes]
    samplers.append(service.create_sampling_client(base_model="tiny-random").result())
    params = types.SamplingParams(max_tokens=4, seed=1, stop=[])
    futures = [s.sample(prompt([1, 2, 3]), 2, params) for s in samplers]
    for future in futures:
        assert len(future.result(timeout=60).sequences) == 2
    schedulers = {id(engine.scheduler_for(c._host)) for c in shapes}
    assert len(schedulers) == 1  # one decode thread and one sampling copy for the base
    running = engine.scheduler_for(shapes[0]._host)
    assert isinstance(running._model, PackedModel)
    resident = [adapter for adapter, _ in running.resident() if adapter is not None]
    assert len(resident) == 3  # the base model needs no slot


def _long_then_short(clients: list[LocalTrainingClient]) -> bool:
    """A long request on the first client's adapter, then, once it decodes, a short one on
    the second's: whether the long one was done when the short one was answered."""
    long, short = (c.save_weights_and_get_sampling_client().result() for c in clients[:2])
    started = threading.Event()
    first = long.sample(
        prompt([1, 2, 3]),
        2,
        types.SamplingParams(max_tokens=60, seed=1, stop=[]),
        on_token=lambda *_: started.set(),
    )
    assert started.wait(timeout=60)
    second = short.sample(prompt([4, 5]), 1, types.SamplingParams(max_tokens=2, seed=2, stop=[]))
    second.result(timeout=60)
    done_first = first.done()
    assert len(first.result(timeout=60).sequences[0].tokens) == 60
    return done_first


def test_a_request_on_another_adapter_joins_the_running_batch(shapes):
    """The short request is answered first: it joined the batch, not waiting for it to drain."""
    assert not _long_then_short(shapes)


def test_one_slot_decodes_one_adapter_at_a_time(tmp_path):
    """adapter_slots=1 (the switch the benchmark compares with): the short request on another
    adapter waits for the running batch to drain."""
    service = local_service(tmp_path, adapter_slots=1)
    try:
        clients = [
            service.create_lora_training_client("tiny-random", rank=4, seed=s).result()
            for s in (1, 2)
        ]
        assert _long_then_short(clients)
    finally:
        service.close()


def test_prompt_logprobs_do_not_wait_for_the_trainer(service, shapes):
    """Scoring runs on the sampling copy: it is answered while the base's training lock is
    held (a client training), and equals the trainer's own forward."""
    client = shapes[0]
    sampler = client.save_weights_and_get_sampling_client().result()
    tokens = [1, 5, 9, 2, 7, 3]
    want = sampler.compute_logprobs(prompt(tokens)).result(timeout=60)
    with client._host.lock:  # as a forward_backward holds it
        got = sampler.compute_logprobs(prompt(tokens)).result(timeout=60)
    assert got == pytest.approx(want)
    forward = client.forward(
        [
            types.Datum(
                model_input=prompt(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 5},
            )
        ],
        "cross_entropy",
    ).result()
    np.testing.assert_allclose(
        got[1:], forward.loss_fn_outputs[0]["logprobs"].to_numpy(), atol=1e-4
    )


def test_slots_are_evicted_least_recently_used_and_never_while_held():
    loads: list[tuple[int, int | None]] = []
    table = AdapterTable(
        2, lambda slot, a: loads.append((slot, a.id if a else None)), base_takes_slot=False
    )
    a, b, c = (AdapterWeights({}, 1.0, 1) for _ in range(3))
    assert table.hold(None) == BASE  # the base model needs no slot here
    assert table.hold(a) == 0 and table.hold(b) == 1
    assert table.hold(c) is None  # both held: c waits
    table.let_go(0)
    table.let_go(1)
    assert table.hold(a) == 0  # still resident: no load
    table.let_go(0)
    assert table.hold(c) == 1  # b was used least recently
    assert loads == [(0, a.id), (1, b.id), (1, c.id)]
    one = AdapterTable(1, lambda slot, adapter: None, base_takes_slot=True)
    assert one.hold(None) == 0 and one.hold(a) is None  # one slot: the base model takes it


def test_an_adapter_a_waiting_request_wants_is_evicted_last():
    """Three adapters taken in turn on two slots: with no look at the waiting requests each
    load would evict the adapter the next request is on."""
    loads: list[tuple[int, int | None]] = []
    table = AdapterTable(
        2, lambda slot, a: loads.append((slot, a.id if a else None)), base_takes_slot=False
    )
    a, b, c = (AdapterWeights({}, 1.0, 1) for _ in range(3))
    assert table.hold(a) == 0 and table.hold(b) == 1
    table.let_go(0)
    table.let_go(1)
    assert table.hold(c, wanted={a.id}) == 1  # a is the least recently used, but wanted
    assert table.hold(a) == 0  # still resident: no load
    assert loads == [(0, a.id), (1, b.id), (1, c.id)]
    table.let_go(0)
    table.let_go(1)
    assert table.hold(b, wanted={a.id, c.id}) == 0  # both wanted, every slot open: evict all
    roomy = AdapterTable(3, lambda slot, adapter: None, base_takes_slot=False)
    assert roomy.hold(a) == 0 and roomy.hold(b) == 1
    roomy.let_go(0)
    roomy.let_go(1)
    assert roomy.hold(c, wanted={a.id, b.id}) == 2  # both wanted: a third slot opens


def test_requests_admitted_together_keep_each_others_adapters(tmp_path):
    """Three slots hold a, b and x, a the least recently used; while a request on b decodes,
    requests on c and on a are admitted together: c evicts x, not a (wanted), so only c loads
    (least recently used alone, c would evict a and a then x)."""
    service = local_service(tmp_path, adapter_slots=3)
    try:
        trainers = [
            service.create_lora_training_client("tiny-random", rank=4, seed=s).result()
            for s in range(4)
        ]
        a, b, x, c = (t.save_weights_and_get_sampling_client().result() for t in trainers)
        short = types.SamplingParams(max_tokens=2, seed=1, stop=[])
        # x decodes longest, so a (then b) is let go before it: a is the least recently used.
        while_decoding(x, 6, lambda: [s.sample(prompt([4, 5]), 1, short) for s in (a, b)])
        table = engine.scheduler_for(trainers[0]._host)._table
        assert table is not None
        assert sorted(adapter for adapter, _ in table.resident()) == sorted(
            s._adapter.id for s in (a, b, x)
        )
        loads: list[int] = []
        load = table._load
        table._load = lambda slot, adapter: (loads.append(adapter.id), load(slot, adapter))
        while_decoding(b, 20, lambda: [s.sample(prompt([4, 5]), 1, short) for s in (c, a)])
        assert loads == [c._adapter.id]
    finally:
        service.close()


def test_a_slot_opens_only_when_every_open_one_is_held(shapes):
    """One adapter after another reuses one slot; a second opens while the first is held. The
    packed model allocates slots as loads reach them (doubling), not the setting's count."""
    packed = PackedModel(shapes[0]._host, torch.float32, slots=8)
    table = AdapterTable(packed.slots, packed.load, base_takes_slot=False)
    a, b, c = (shapes[0]._host.snapshot() for _ in range(3))
    assert packed.allocated == 0 and not any(g.b_t.numel() for g in _groups(packed))
    assert table.hold(a) == 0
    table.let_go(0)
    assert table.hold(b) == 0  # a is evicted: nothing decodes on it
    assert packed.allocated == 1
    one_slot = sum(g.b_t.nbytes for g in _groups(packed))
    assert table.hold(c) == 1  # b is held: a second slot opens
    assert packed.allocated == 2
    assert sum(g.b_t.nbytes for g in _groups(packed)) == 2 * one_slot
    assert [adapter for adapter, _ in table.resident()] == [b.id, c.id]


def test_a_free_slot_mid_batch_keeps_the_one_adapter_products(shapes, monkeypatch):
    """A row that finishes at once leaves its slot free mid-batch: the rows beside it, all on
    one adapter, still take that adapter's own products (a free slot's row, computed and
    dropped, takes their adapter), not the products for several adapters."""
    packed = PackedModel(shapes[0]._host, torch.float32, slots=2)
    packed.load(0, shapes[0]._host.snapshot())
    seen: list[int | None] = []
    rows_of = packed.rows

    def spy(adapters: AdapterIndex):
        rows = rows_of(adapters)
        if rows.groups is not None:
            seen.append(rows.groups.single)
        return rows

    monkeypatch.setattr(packed, "rows", spy)
    first, middle, last = _rows()
    middle.max_tokens = 1  # done at its first token: slot 1 is free from the first step
    _drain(_slot_batch(packed, shapes[0]), [first, middle, last])
    assert middle.stop_reason == "length" and len(first.tokens) == 12
    assert seen and set(seen) == {0}
