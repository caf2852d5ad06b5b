"""The local backend end to end on tiny-random: training, sampling, checkpoints, batching, RL."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tinker import types

from core.model_names import ModelNotAvailable
from runners.engine.local import LocalServiceClient, LocalTrainingClient
from runners.engine.sample.sampler import _stops
from tests.support.local_backend import local_service

ADAM = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
TEXTS = ["hello world", "the cat sat on the mat", "a b c d e f g", "RL on a CPU, why not?"]


def ce_datum(tokens: list[int]) -> types.Datum:
    """Supervised datum over a whole sequence: input tokens[:-1], targets tokens[1:]."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def ce_batch(trainer: LocalTrainingClient) -> list[types.Datum]:
    tokenizer = trainer.get_tokenizer()
    return [ce_datum(tokenizer.encode(text)) for text in TEXTS]


def train_steps(trainer: LocalTrainingClient, data: list[types.Datum], steps: int) -> None:
    for _ in range(steps):
        trainer.forward_backward(data, "cross_entropy")
        trainer.optim_step(ADAM)
    trainer.forward(data, "cross_entropy").result()  # waits for the queue to drain


def prompt(tokens: list[int]) -> types.ModelInput:
    return types.ModelInput.from_ints(tokens)


# ----- training ---------------------------------------------------------------------------


def test_forward_backward_and_optim_step_lower_cross_entropy(trainer):
    data = ce_batch(trainer)
    before = trainer.forward(data, "cross_entropy").result().metrics["loss:sum"]
    # Submitted back to back before waiting on any: they run in order.
    futures = []
    for _ in range(8):
        futures.append(trainer.forward_backward(data, "cross_entropy"))
        futures.append(trainer.optim_step(ADAM))
    results = [f.result(timeout=60) for f in futures]
    after = trainer.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert after < 0.7 * before
    assert results[0].metrics["loss:sum"] == pytest.approx(before, rel=1e-5)
    assert [r.metrics["step"] for r in results[1::2]] == [float(i) for i in range(1, 9)]
    assert results[1].metrics["grad_norm"] > 0


def test_forward_outputs_match_tinker_shapes(trainer):
    data = ce_batch(trainer)
    out = trainer.forward(data, "cross_entropy").result()
    assert isinstance(out, types.ForwardBackwardOutput)
    assert len(out.loss_fn_outputs) == len(data)
    total = 0.0
    for datum, record in zip(data, out.loss_fn_outputs, strict=True):
        logprobs = record["logprobs"]
        assert isinstance(logprobs, types.TensorData) and logprobs.dtype == "float32"
        assert logprobs.to_numpy().shape == (datum.model_input.length,)
        assert (logprobs.to_numpy() <= 0).all()
        total -= float(logprobs.to_numpy().sum())
    # loss:sum of cross_entropy with unit weights is minus the sum of target logprobs
    assert out.metrics["loss:sum"] == pytest.approx(total, rel=1e-5)


def test_gradients_accumulate_until_optim_step(service):
    one = service.create_lora_training_client("tiny-random", rank=4, seed=3).result()
    two = service.create_lora_training_client("tiny-random", rank=4, seed=3).result()
    data = ce_batch(one)
    # Two calls with half the data each equal one call with all of it (sum reduction).
    one.forward_backward(data[:2], "cross_entropy")
    one.forward_backward(data[2:], "cross_entropy")
    one.optim_step(ADAM)
    two.forward_backward(data, "cross_entropy")
    two.optim_step(ADAM)
    lp_one = one.forward(data, "cross_entropy").result().loss_fn_outputs
    lp_two = two.forward(data, "cross_entropy").result().loss_fn_outputs
    for a, b in zip(lp_one, lp_two, strict=True):
        np.testing.assert_allclose(a["logprobs"].to_numpy(), b["logprobs"].to_numpy(), atol=1e-5)


def test_futures_are_awaitable_and_carry_errors(trainer, tmp_path):
    data = ce_batch(trainer)

    async def main() -> float:
        fb = trainer.forward_backward(data, "cross_entropy")
        step = trainer.optim_step(ADAM)
        out = await fb
        await step.result_async(timeout=60)
        return out.metrics["loss:sum"]

    assert asyncio.run(main()) > 0
    missing = trainer.load_state(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="not a local state checkpoint"):
        missing.result(timeout=30)

    async def awaited() -> None:
        await trainer.load_state(str(tmp_path / "nowhere"))

    with pytest.raises(FileNotFoundError):
        asyncio.run(awaited())


def test_bad_requests_are_rejected_clearly(trainer):
    tokens = trainer.get_tokenizer().encode("abc")
    datum = ce_datum(tokens)
    with pytest.raises(ValueError, match="unknown loss_fn 'reinforce'.*importance_sampling"):
        trainer.forward_backward([datum], "reinforce")
    masked = types.Datum(
        model_input=datum.model_input,
        loss_fn_inputs={**datum.loss_fn_inputs, "mask": np.ones(2, dtype=np.float32)},
    )
    with pytest.raises(ValueError, match=r"data\[0\].loss_fn_inputs: unknown key 'mask'"):
        trainer.forward_backward([masked], "cross_entropy")
    with pytest.raises(ValueError, match="unknown loss_fn_config key 'beta'"):
        trainer.forward_backward([datum], "cross_entropy", {"beta": 0.1})
    no_advantages = types.Datum(
        model_input=datum.model_input,
        loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": [0.0, 0.0]},
    )
    with pytest.raises(ValueError, match="missing required key 'advantages'"):
        trainer.forward_backward([no_advantages], "importance_sampling")
    short = types.Datum(
        model_input=datum.model_input,
        loss_fn_inputs={"target_tokens": tokens[1:2], "weights": [1.0]},
    )
    with pytest.raises(ValueError, match=r"expected \(2,\)"):
        trainer.forward_backward([short], "cross_entropy")
    with pytest.raises(ValueError, match="checkpoint name '../escape' is not allowed"):
        trainer.save_state("../escape")
    with pytest.raises(ValueError, match="AdamW only"):
        trainer.optim_step(types.DimuonParams(learning_rate=0.1))


def test_get_info_and_tokenizer(trainer):
    info = trainer.get_info()
    assert info.model_data.model_name == "tiny-random"
    assert info.is_lora and info.lora_rank == 8
    assert trainer.get_tokenizer().eos_token == "<|im_end|>"


def test_lora_targets_follow_the_flags(service):
    client = service.create_lora_training_client(
        "tiny-random", rank=2, seed=0, train_mlp=False, train_unembed=False
    ).result()
    names = list(client._host.params)
    assert names and all("self_attn" in n for n in names)
    with pytest.raises(ValueError, match="at least one of"):
        service.create_lora_training_client(
            "tiny-random", train_mlp=False, train_attn=False, train_unembed=False
        )
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        service.create_lora_training_client("tiny-random", rank=0)


def test_same_seed_gives_same_adapter(service):
    a = service.create_lora_training_client("tiny-random", rank=4, seed=11).result()
    b = service.create_lora_training_client("tiny-random", rank=4, seed=11).result()
    c = service.create_lora_training_client("tiny-random", rank=4, seed=12).result()
    ta, tb, tc = a.adapter_tensors(), b.adapter_tensors(), c.adapter_tensors()
    for name, tensor in ta.items():
        assert torch.equal(tensor, tb[name])
    assert any(not torch.equal(t, tc[n]) for n, t in ta.items())
    # One base model, one host for the three (same LoRA shape), three adapters.
    assert a._host is b._host is c._host
    assert [(name, users) for name, _, users in service.bases.loaded()] == [("tiny-random", 3)]


# ----- sampling ---------------------------------------------------------------------------


def test_sampled_logprobs_match_a_forward_pass(trainer):
    train_steps(trainer, ce_batch(trainer), 3)  # a non-trivial adapter
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokenizer = trainer.get_tokenizer()
    prompts = [tokenizer.encode(t) for t in ("hi", "a longer prompt here", "mid size")]
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=5, stop=[])
    futures = [sampler.sample(prompt(p), 2, params) for p in prompts]
    responses = [f.result(timeout=60) for f in futures]
    assert sampler.sampling_stats()["batches"] == 1  # three prompts, padded into one batch
    data, expected = [], []
    for p, response in zip(prompts, responses, strict=True):
        assert len(response.sequences) == 2
        for seq in response.sequences:
            assert seq.stop_reason == "length" and len(seq.tokens) == 12
            data.append(ce_datum(p + seq.tokens))
            expected.append(seq.logprobs)
    out = trainer.forward(data, "cross_entropy").result()
    for record, logprobs in zip(out.loss_fn_outputs, expected, strict=True):
        forward_lp = record["logprobs"].to_numpy()[-len(logprobs) :]
        np.testing.assert_allclose(forward_lp, logprobs, atol=1e-4)


def test_seed_reproduces_and_snapshot_is_frozen(trainer):
    tokens = trainer.get_tokenizer().encode("seed test")
    sampler = trainer.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=10, temperature=1.0, seed=42, stop=[])
    first = sampler.sample(prompt(tokens), 3, params).result()
    # Training after the snapshot must not change what the snapshot samples.
    train_steps(trainer, ce_batch(trainer), 2)
    again = sampler.sample(prompt(tokens), 3, params).result()
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]
    assert len({tuple(s.tokens) for s in first.sequences}) > 1  # samples of a group differ
    other = sampler.sample(prompt(tokens), 3, params.model_copy(update={"seed": 43})).result()
    assert [s.tokens for s in other.sequences] != [s.tokens for s in first.sequences]


def test_greedy_top_k_and_top_p(trainer):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokens = trainer.get_tokenizer().encode("greedy")
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])
    a = sampler.sample(prompt(tokens), 2, greedy).result().sequences
    assert a[0].tokens == a[1].tokens
    # top_k=1 and a tiny top_p both reduce to the most likely token
    for params in (
        types.SamplingParams(max_tokens=6, temperature=1.0, top_k=1, seed=1, stop=[]),
        types.SamplingParams(max_tokens=6, temperature=1.0, top_p=1e-6, seed=1, stop=[]),
    ):
        assert sampler.sample(prompt(tokens), 1, params).result().sequences[0].tokens == a[0].tokens


def test_stop_tokens_and_stop_strings(trainer):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokenizer = trainer.get_tokenizer()
    tokens = tokenizer.encode("stops")
    free = types.SamplingParams(max_tokens=20, temperature=1.0, seed=9, stop=[])
    reference = sampler.sample(prompt(tokens), 1, free).result().sequences[0].tokens
    stop_token = reference[5]
    cut = reference.index(stop_token) + 1
    by_id = sampler.sample(prompt(tokens), 1, free.model_copy(update={"stop": [stop_token]}))
    seq = by_id.result().sequences[0]
    assert seq.stop_reason == "stop" and seq.tokens == reference[:cut]  # stop token included
    text = tokenizer.decode(reference[3:5])
    by_text = sampler.sample(prompt(tokens), 1, free.model_copy(update={"stop": [text]}))
    seq = by_text.result().sequences[0]
    assert seq.stop_reason == "stop"
    assert text in tokenizer.decode(seq.tokens)
    assert text not in tokenizer.decode(seq.tokens[:-1])  # stopped at the first match


def test_stop_parsing():
    eos = {7}
    assert _stops(None, eos) == (frozenset({7}), ())
    assert _stops([], eos) == (frozenset(), ())
    assert _stops("\n", eos) == (frozenset({7}), ("\n",))
    assert _stops([3, 4], eos) == (frozenset({3, 4, 7}), ())
    with pytest.raises(ValueError, match="list of strings or a list of ints"):
        _stops(["a", 3], eos)


def test_concurrent_sample_calls_are_batched(trainer):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokenizer = trainer.get_tokenizer()
    prompts = [tokenizer.encode("x" * (1 + i % 7) + str(i)) for i in range(20)]

    def params(i: int) -> types.SamplingParams:
        return types.SamplingParams(max_tokens=8, temperature=1.0, seed=100 + i, stop=[])

    async def one(i: int) -> types.SampleResponse:
        return await sampler.sample(prompt(prompts[i]), 1, params(i))

    async def main() -> list[types.SampleResponse]:
        return await asyncio.gather(*(one(i) for i in range(20)))

    before = sampler.sampling_stats()
    batched = asyncio.run(main())
    after = sampler.sampling_stats()
    assert after["sequences"] - before["sequences"] == 20
    assert after["batches"] - before["batches"] <= 2
    # Each caller got its own answer: the same as asking alone.
    for i in (0, 7, 19):
        alone = sampler.sample(prompt(prompts[i]), 1, params(i)).result().sequences[0]
        assert batched[i].sequences[0].tokens == alone.tokens
        np.testing.assert_allclose(batched[i].sequences[0].logprobs, alone.logprobs, atol=1e-4)


def test_prompt_logprobs_and_base_model_sampling(service, trainer):
    train_steps(trainer, ce_batch(trainer), 2)
    tokens = trainer.get_tokenizer().encode("hello world")
    sampler = trainer.save_weights_and_get_sampling_client().result()
    lps = sampler.compute_logprobs(prompt(tokens)).result()
    assert lps[0] is None and len(lps) == len(tokens)
    forward = trainer.forward([ce_datum(tokens)], "cross_entropy").result()
    np.testing.assert_allclose(lps[1:], forward.loss_fn_outputs[0]["logprobs"].to_numpy(), 1e-4)
    base = service.create_sampling_client(base_model="tiny-random").result()
    base_lps = base.compute_logprobs(prompt(tokens)).result()
    assert not np.allclose(base_lps[1:], lps[1:], atol=1e-3)  # the adapter is switched off
    with pytest.raises(ValueError, match="topk_sample_logprobs is not served"):
        sampler.sample(
            prompt(tokens), 1, types.SamplingParams(max_tokens=1), topk_sample_logprobs=2
        )


# ----- checkpoints ------------------------------------------------------------------------


def test_sampler_weights_reload_to_identical_samples(trainer, tmp_path):
    train_steps(trainer, ce_batch(trainer), 3)
    in_memory = trainer.save_weights_and_get_sampling_client().result()
    saved = trainer.save_weights_for_sampler("step-3").result()
    folder = Path(saved.path)
    assert folder == (tmp_path / "checkpoints" / "step-3" / "sampler").resolve()
    assert {p.name for p in folder.iterdir()} == {
        "adapter_model.safetensors",
        "adapter_config.json",
        "rlcs_sampler.json",
        "rlcs_manifest.json",
    }
    tokens = trainer.get_tokenizer().encode("reload")
    params = types.SamplingParams(max_tokens=10, temperature=1.0, seed=7, stop=[])
    want = in_memory.sample(prompt(tokens), 3, params).result().sequences
    # Reloaded into the same service (shares the training model) and into a fresh one.
    same = trainer.create_sampling_client(saved.path).result()
    fresh_service = local_service(tmp_path / "other")
    try:
        fresh = fresh_service.create_sampling_client(model_path=saved.path).result()
        for client in (same, fresh):
            got = client.sample(prompt(tokens), 3, params).result().sequences
            assert [s.tokens for s in got] == [s.tokens for s in want]
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    finally:
        fresh_service.close()


@pytest.mark.filterwarnings("ignore:.*tie_word_embeddings:UserWarning")
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_sampler_folder_is_a_standard_peft_adapter(trainer):
    from peft import PeftModel

    from runners.models.tiny import build_tiny

    train_steps(trainer, ce_batch(trainer), 2)
    path = trainer.save_weights_for_sampler("peft-check").result().path
    base, tokenizer = build_tiny()
    model = PeftModel.from_pretrained(base, path).eval()
    tokens = tokenizer.encode("peft loads it")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens[:-1]])).logits[0]
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
    out = trainer.forward([ce_datum(tokens)], "cross_entropy").result()
    np.testing.assert_allclose(out.loss_fn_outputs[0]["logprobs"].to_numpy(), want, atol=1e-5)
    # Adapter only: the file is small next to the base model's weights.
    size = (Path(path) / "adapter_model.safetensors").stat().st_size
    assert size < 4 * sum(p.numel() for p in base.parameters())


def test_state_resume_restores_weights_and_optimizer(service, trainer):
    data = ce_batch(trainer)
    train_steps(trainer, data, 2)
    state = trainer.save_state("resume-me").result()
    assert Path(state.path).is_dir() and Path(state.path).name == "state"
    train_steps(trainer, data, 1)
    want = trainer.forward(data, "cross_entropy").result().loss_fn_outputs

    resumed = service.create_training_client_from_state_with_optimizer(state.path).result()
    assert resumed.steps == 2
    train_steps(resumed, data, 1)
    got = resumed.forward(data, "cross_entropy").result().loss_fn_outputs
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g["logprobs"].to_numpy(), w["logprobs"].to_numpy(), atol=1e-6)

    # Weights only: same start, but a fresh Adam makes the next step differ.
    fresh = service.create_training_client_from_state(state.path).result()
    train_steps(fresh, data, 1)
    other = fresh.forward(data, "cross_entropy").result().loss_fn_outputs
    assert not np.allclose(other[0]["logprobs"].to_numpy(), want[0]["logprobs"].to_numpy())


def test_save_state_overwrites_atomically(trainer):
    first = trainer.save_state("same-name").result().path
    train_steps(trainer, ce_batch(trainer), 1)
    second = trainer.save_state("same-name").result().path
    assert first == second
    leftovers = [p.name for p in Path(first).parent.iterdir() if p.name != "state"]
    assert leftovers == []


# ----- RL ---------------------------------------------------------------------------------


def test_importance_sampling_rl_toy_raises_reward(service):
    """Reward 1 when the first sampled token is a chosen one; group mean-centred advantages."""
    trainer = service.create_lora_training_client("tiny-random", rank=8, seed=0).result()
    tokenizer = trainer.get_tokenizer()
    prompts = [tokenizer.encode(p) for p in ("Say A:", "Answer:")]
    # The chosen token: the third most likely first token under the start weights, found by
    # scoring every candidate with one forward pass, so top-k sampling meets it at the start.
    targets = []
    for p in prompts:
        data = [ce_datum(p + [token]) for token in range(len(tokenizer))]
        out = trainer.forward(data, "cross_entropy").result().loss_fn_outputs
        last = np.array([o["logprobs"].to_numpy()[-1] for o in out])
        targets.append(int(np.argsort(-last)[2]))

    params = dict(max_tokens=1, temperature=1.0, top_k=8, stop=[])
    group = 16
    means = []
    for step in range(30):
        sampler = trainer.save_weights_and_get_sampling_client().result()
        futures = [
            sampler.sample(prompt(p), group, types.SamplingParams(seed=1000 * step + i, **params))
            for i, p in enumerate(prompts)
        ]
        data, rewards_all = [], []
        for p, target, future in zip(prompts, targets, futures, strict=True):
            sequences = future.result().sequences
            rewards = [1.0 if s.tokens[0] == target else 0.0 for s in sequences]
            rewards_all += rewards
            mean = sum(rewards) / len(rewards)
            for seq, reward in zip(sequences, rewards, strict=True):
                if reward == mean:
                    continue
                full = p + seq.tokens
                pad = [0.0] * (len(p) - 1)
                data.append(
                    types.Datum(
                        model_input=prompt(full[:-1]),
                        loss_fn_inputs={
                            "target_tokens": full[1:],
                            "logprobs": pad + list(seq.logprobs),
                            "advantages": pad + [reward - mean] * len(seq.tokens),
                        },
                    )
                )
        means.append(sum(rewards_all) / len(rewards_all))
        if data:
            trainer.forward_backward(data, "importance_sampling")
            trainer.optim_step(types.AdamParams(learning_rate=1e-2, eps=1e-8))
    start, end = np.mean(means[:5]), np.mean(means[-5:])
    assert end > start + 0.4, f"reward went from {start:.2f} to {end:.2f}: {means}"


# ----- configuration errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "dtype", "message"),
    [
        ("tpu", "auto", "device must be one of"),
        ("cpu", "float8", "dtype must be one of"),
        ("", "auto", "device must be one of"),
    ],
)
def test_bad_device_or_dtype(tmp_path, device, dtype, message):
    with pytest.raises(ValueError, match=message):
        LocalServiceClient(checkpoint_dir=tmp_path, models_dir=tmp_path, device=device, dtype=dtype)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="CUDA is not available"):
        LocalServiceClient(checkpoint_dir=tmp_path, models_dir=tmp_path, device="cuda")


def test_unknown_model_fails_fast(service):
    started = time.monotonic()
    for name in ("./no/such/folder", "no-such-org/no-such-model-xyz"):
        with pytest.raises(ModelNotAvailable, match="cannot be resolved offline.*tiny-random"):
            service.create_lora_training_client(name).result(timeout=60)
    assert time.monotonic() - started < 30


def test_closed_service_refuses_work(tmp_path):
    svc = LocalServiceClient(checkpoint_dir=tmp_path, models_dir=tmp_path, device="cpu")
    svc.close()
    with pytest.raises(RuntimeError, match="closed"):
        svc.create_sampling_client(base_model="tiny-random")
