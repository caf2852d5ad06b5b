"""What a client held goes when it leaves (issue 52): the last client of a base takes the
base's weights, its decode scheduler and sampling copy with it; a lane's host goes with its
last user; a departed client's adapter leaves the host it shared; a closed sampler's adapter
leaves its slot, and the slots shrink. Asserted on the engine's own objects, not on RSS."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from tinker import types

from runners.engine.local import LocalSamplingClient, LocalServiceClient, LocalTrainingClient
from runners.engine.sample import scheduler as engine
from runners.engine.sample.packed_model import PackedModel
from tests.backend.test_local_backend import ce_batch, prompt, train_steps
from tests.support.local_backend import local_service, while_decoding

SHORT = types.SamplingParams(max_tokens=3, seed=1, stop=[])


def _sample(sampler: LocalSamplingClient) -> types.SampleResponse:
    return sampler.sample(prompt([1, 2, 3]), 2, SHORT).result(timeout=60)


def _client(service: LocalServiceClient, seed: int) -> LocalTrainingClient:
    return service.create_lora_training_client("tiny-random", rank=4, seed=seed).result()


def test_the_last_client_of_a_base_takes_its_weights_and_sampler_with_it(tmp_path: Path) -> None:
    service = local_service(tmp_path)
    try:
        trainer = _client(service, 0)
        sampler = trainer.save_weights_and_get_sampling_client().result()
        _sample(sampler)
        scheduler = engine.scheduler_for(trainer._host)
        copy = weakref.ref(scheduler._model)
        adapter = weakref.ref(sampler._adapter)
        sampler.close()
        service.forget(trainer)

        assert service.bases.loaded() == []
        assert scheduler.closed and scheduler not in engine._schedulers.values()
        assert scheduler._model is None and scheduler._batch is None
        assert copy() is None and adapter() is None  # nothing else held them
        # The closed client still holds its host, but no longer its memory.
        weights = [p.untyped_storage().nbytes() for p in trainer._host.model.parameters()]
        assert max(weights) <= 4  # emptied base weights; LoRA stand-ins of one element
        assert trainer.adapter_tensors() == {}
        with pytest.raises(RuntimeError, match="closed"):
            sampler.sample(prompt([1, 2]), 1, SHORT)
    finally:
        service.close()


def test_a_lanes_host_goes_with_its_last_user(tmp_path: Path) -> None:
    service = local_service(tmp_path, training_lanes=2)
    try:
        stays, leaves = _client(service, 0), _client(service, 1)
        assert (stays._host.lane, leaves._host.lane) == (0, 1)
        sampler = leaves.save_weights_and_get_sampling_client().result()
        _sample(sampler)  # the base's scheduler is built from the leaving lane's host
        kept = stays.save_weights_and_get_sampling_client().result()
        _sample(kept)
        scheduler = engine.scheduler_for(stays._host)
        host = weakref.ref(leaves._host)
        sampler.close()
        service.forget(leaves)
        del leaves, sampler
        gc.collect()

        assert host() is None  # neither the scheduler nor its batch holds it
        (base,) = service.bases._bases.values()
        assert [h.lane for h in base.hosts.values()] == [0]
        assert len(_sample(kept).sequences) == 2  # the scheduler samples on, from lane 0's
        assert engine.scheduler_for(stays._host) is scheduler and not scheduler.closed
    finally:
        service.close()


def test_a_departed_clients_adapter_leaves_the_host_it_shared(tmp_path: Path) -> None:
    service = local_service(tmp_path)
    try:
        stays, leaves = _client(service, 0), _client(service, 1)
        assert stays._host is leaves._host
        train_steps(leaves, ce_batch(leaves), 1)  # its tensors are in the LoRA parameters
        tensor = weakref.ref(next(iter(leaves._adapter.tensors.values())))
        service.forget(leaves)

        assert tensor() is None
        host = stays._host
        assert host.active is None
        assert all(p.untyped_storage().nbytes() <= 4 for p in host.params.values())
        before = stays.forward(ce_batch(stays), "cross_entropy").result().metrics["loss:sum"]
        train_steps(stays, ce_batch(stays), 1)  # the one left trains on, its own tensors in
        after = stays.forward(ce_batch(stays), "cross_entropy").result().metrics["loss:sum"]
        assert after < before
    finally:
        service.close()


def test_closed_samplers_leave_their_slots_and_the_slots_shrink(tmp_path: Path) -> None:
    service = local_service(tmp_path)
    try:
        trainers = [_client(service, seed) for seed in range(3)]
        for trainer in trainers:
            train_steps(trainer, ce_batch(trainer), 1)
        x, a, c = (t.save_weights_and_get_sampling_client().result() for t in trainers)
        ids = [s._adapter.id for s in (x, a, c) if s._adapter is not None]
        while_decoding(x, 6, lambda: [a.sample(prompt([4, 5]), 1, SHORT)])
        scheduler = engine.scheduler_for(trainers[0]._host)
        model = scheduler._model
        assert isinstance(model, PackedModel)
        assert [i for i, _ in scheduler.resident()] == ids[:2]
        assert model.allocated == 2
        gone = [weakref.ref(s._adapter) for s in (x, a) if s._adapter is not None]
        x.close()
        a.close()

        _sample(c)  # queued after the closes: the decode thread emptied their slots first
        assert scheduler.resident() == [(ids[2], 0)]
        assert model.allocated == 1
        assert [ref() for ref in gone] == [None, None]
        assert all(g.b_t.shape[0] == 1 for g in model._groups())
    finally:
        service.close()


@pytest.mark.parametrize("masked", [False, True])
def test_a_shrunk_copy_scores_its_kept_slots_as_before(trainer, masked: bool) -> None:
    train_steps(trainer, ce_batch(trainer), 1)
    model = PackedModel(trainer._host, torch.float32, masked=masked)
    kept = trainer._host.snapshot()
    model.load(0, kept)
    model.load(2, trainer._host.snapshot())
    ids = [1, 5, 9, 4, 2]
    want = model.score(ids, 0)
    assert model.allocated >= 3
    layout = model.layout

    model.shrink(1)
    assert model.allocated == 1 and model.layout > layout
    torch.testing.assert_close(model.score(ids, 0), want, rtol=0, atol=1e-6)
    model.load(1, kept)  # the slots grow again as loads reach them
    torch.testing.assert_close(model.score(ids, 1), want, rtol=0, atol=1e-6)


def test_a_base_forgotten_while_a_call_reaches_it_is_loaded_again(tmp_path: Path) -> None:
    service = local_service(tmp_path)
    try:
        trainer = _client(service, 0)
        bases = service.bases
        base = bases._base("tiny-random")  # found, as a new client's call finds it
        service.forget(trainer)  # ... when the last client leaves: its weights are freed
        assert base.forgotten and bases._host(base, None) is None
        host = bases.bare_host("tiny-random")  # a fresh load, not the emptied weights
        assert next(host.model.parameters()).numel() > 0
        host.release()
        assert bases.loaded() == []
    finally:
        service.close()
