"""Several LoRA clients on one base model: loaded once, each client's adapter, gradients and
optimizer its own, steps that never interleave and take turns in the order asked, samples that
do not depend on who else samples, memory freed with the last user, a budget."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tinker import types

from runners.engine.bases import ModelRefused, model_bytes
from runners.engine.fair_lock import FairLock
from runners.engine.local import LocalTrainingClient
from tests.backend.test_local_backend import ADAM, ce_batch
from tests.support.local_backend import local_service


def steps(trainer: LocalTrainingClient, count: int) -> list[float]:
    data = ce_batch(trainer)
    futures = []
    for _ in range(count):
        futures.append(trainer.forward_backward(data, "cross_entropy"))
        trainer.optim_step(ADAM)
    losses = [f.result(timeout=60).metrics["loss:sum"] for f in futures]
    return [*losses, trainer.forward(data, "cross_entropy").result().metrics["loss:sum"]]


def base_storages(trainer: LocalTrainingClient) -> set[int]:
    """Where the base model's weights of a client's host live (its LoRA parameters aside)."""
    lora = {id(p) for p in trainer._host.params.values()}
    return {p.data_ptr() for p in trainer._host.model.parameters() if id(p) not in lora}


def test_two_clients_at_once_train_as_each_would_alone(tmp_path: Path) -> None:
    alone = local_service(tmp_path / "alone")
    try:
        a = alone.create_lora_training_client("tiny-random", rank=4, seed=1).result()
        want_a = steps(a, 3)
        b = alone.create_lora_training_client("tiny-random", rank=4, seed=2).result()
        want_b = steps(b, 3)
    finally:
        alone.close()

    shared = local_service(tmp_path / "shared")
    try:
        a = shared.create_lora_training_client("tiny-random", rank=4, seed=1).result()
        b = shared.create_lora_training_client("tiny-random", rank=4, seed=2).result()
        assert a._host is b._host  # one model: the adapters take turns in its LoRA parameters
        with ThreadPoolExecutor(2) as pool:
            got_a, got_b = pool.map(lambda t: steps(t, 3), [a, b])
        assert got_a == pytest.approx(want_a, rel=1e-5)
        assert got_b == pytest.approx(want_b, rel=1e-5)
        assert got_a != pytest.approx(got_b, rel=1e-3)
    finally:
        shared.close()


def test_two_clients_at_once_sample_as_each_would_alone(tmp_path: Path) -> None:
    """Each client's samples (tokens, logprobs) are the same whether it samples alone or
    while another client samples on its own adapter in the same decode batch (float32)."""

    def draw(trainer: LocalTrainingClient) -> list[tuple[list[int], list[float]]]:
        sampler = trainer.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=12, seed=7, stop=[])
        tokens = trainer.get_tokenizer().encode("two clients")
        response = sampler.sample(types.ModelInput.from_ints(tokens), 3, params).result(60)
        return [(s.tokens, s.logprobs) for s in response.sequences]

    service = local_service(tmp_path)
    try:
        a = service.create_lora_training_client("tiny-random", rank=4, seed=1).result()
        b = service.create_lora_training_client("tiny-random", rank=8, seed=2).result()
        for client in (a, b):
            steps(client, 2)
        want_a, want_b = draw(a), draw(b)
        with ThreadPoolExecutor(2) as pool:
            got_a, got_b = pool.map(draw, [a, b])
    finally:
        service.close()
    for want, got in ((want_a, got_a), (want_b, got_b)):
        assert [t for t, _ in got] == [t for t, _ in want]
        for (_, lp_got), (_, lp_want) in zip(got, want, strict=True):
            assert lp_got == pytest.approx(lp_want, abs=1e-5)
    assert [t for t, _ in got_a] != [t for t, _ in got_b]


def test_training_clients_take_turns_in_the_order_they_asked() -> None:
    """The base's lock is handed to waiters first come, first served (an RLock races)."""
    lock = FairLock()
    order: list[int] = []
    lock.acquire()
    threads = []
    for i in range(4):

        def wait(i: int = i) -> None:
            with lock:
                order.append(i)

        thread = threading.Thread(target=wait)
        thread.start()
        threads.append(thread)
        while len(lock._waiting) < i + 1:  # this one queued before the next starts
            threading.Event().wait(0.001)
    with lock:  # reentrant
        pass
    lock.release()
    for thread in threads:
        thread.join(timeout=10)
    assert order == [0, 1, 2, 3]


def test_other_lora_shapes_share_the_base_weights(service) -> None:
    a = service.create_lora_training_client("tiny-random", rank=4, seed=1).result()
    b = service.create_lora_training_client("tiny-random", rank=2, train_mlp=False).result()
    assert a._host is not b._host and a._host.lock is b._host.lock

    assert base_storages(a) == base_storages(b)
    ((name, nbytes, users),) = service.bases.loaded()
    assert (name, users) == ("tiny-random", 2)
    assert nbytes == model_bytes(a._host.model.get_base_model()) - sum(
        t.nbytes for t in a.adapter_tensors().values()
    )


def test_the_last_user_frees_the_base(service) -> None:
    trainer = service.create_lora_training_client("tiny-random", rank=4, seed=1).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    service.forget(trainer)
    assert [users for *_, users in service.bases.loaded()] == [1]  # the sampler holds it
    tokens = [1, 2, 3]
    params = types.SamplingParams(max_tokens=3, seed=1, stop=[])
    assert len(sampler.sample(types.ModelInput.from_ints(tokens), 1, params).result().sequences)
    sampler.close()
    assert service.bases.loaded() == []


def test_a_new_base_past_the_budget_is_refused(tmp_path: Path) -> None:
    from runners.models.tiny import build_tiny

    model, tokenizer = build_tiny()
    folder = tmp_path / "another-model"  # a second base model, as a local folder
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    room = int(model_bytes(model) * 1.5)  # one of them fits, two do not
    service = local_service(tmp_path / "budget", memory_budget_bytes=room)
    try:
        service.create_lora_training_client("tiny-random", rank=2).result()
        service.create_lora_training_client("tiny-random", rank=4).result()  # same base: fine
        with pytest.raises(ModelRefused, match=r"loaded now: tiny-random \(0 MiB, 2 client"):
            service.create_lora_training_client(str(folder), rank=2).result()
    finally:
        service.close()


def test_a_snapshot_does_not_wait_for_another_clients_turn(service) -> None:
    """A step's new sampler (`save_weights_and_get_sampling_client`) while another client on
    the base holds its training turn: ready at once, not after that turn (with 4 runs on one
    host a run's snapshot waited up to 8.8 s for the others' turns)."""
    a = service.create_lora_training_client("tiny-random", rank=4, seed=1).result()
    b = service.create_lora_training_client("tiny-random", rank=4, seed=2).result()
    held, done = threading.Event(), threading.Event()

    def a_turn() -> None:
        with a._host.lock:  # as a training pass holds it
            held.set()
            done.wait(30)

    holder = threading.Thread(target=a_turn)
    holder.start()
    try:
        assert held.wait(10)
        sampler = b.save_weights_and_get_sampling_client().result(timeout=10)
        assert not done.is_set()  # made while the other client's turn went on
    finally:
        done.set()
        holder.join()
    response = sampler.sample(
        types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2)
    ).result()
    assert len(response.sequences[0].tokens) == 2
