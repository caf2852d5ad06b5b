"""stable_reinforce through the API, as tinker-cookbook's RL loop uses it: a sampler made with
record_stability_info records each sequence under the id the server gave it, datums name
spans of them (Datum.with_provenance) and the loss reads the recorded sampler logprobs, never
the client's copies. Sequences are the session's own: one unknown, expired, drawn without
recording or by another session is a failed request (category user) naming it."""

from __future__ import annotations

import pytest
import tinker
from tinker import types

from tests.support.cookbook_datums import rl_datum
from tests.support.helpers import wait_for
from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import WAIT_S
from tests.tinker_api.reference import ADAM

pytestmark = pytest.mark.timeout(180)
PROMPT = [83, 97, 121, 32, 65, 58]
PARAMS = types.SamplingParams(max_tokens=6, temperature=1.0, seed=11, stop=[])


def draw(sampler: tinker.SamplingClient, n: int) -> list[types.SampledSequence]:
    prompt = types.ModelInput.from_ints(PROMPT)
    return list(sampler.sample(prompt, n, PARAMS).result(WAIT_S).sequences)


def test_stable_reinforce_reads_what_the_server_recorded(
    service: tinker.ServiceClient, server: LiveServer
) -> None:
    training = service.create_lora_training_client("tiny-random", rank=4, seed=21).result(WAIT_S)
    recording = training.save_weights_and_get_sampling_client(record_stability_info=True)
    sequences = draw(recording.result(WAIT_S), 3)
    ids = [s.sequence_id for s in sequences]
    assert len(set(ids)) == 3 and all(
        i.startswith(f"{training.model_id.split(':')[0]}:") for i in ids
    )
    advantages = [1.0, -1.0, 0.5]
    honest = [rl_datum(PROMPT, s, a) for s, a in zip(sequences, advantages, strict=True)]
    lying = [
        rl_datum(PROMPT, s, a, logprobs=[-9.0] * len(s.tokens))
        for s, a in zip(sequences, advantages, strict=True)
    ]
    out = training.forward(honest, "stable_reinforce").result(WAIT_S)
    # The loss reads the server's recording of the sampler, not the datums' copies.
    assert training.forward(lying, "stable_reinforce").result(WAIT_S).metrics == out.metrics
    assert out.metrics["sampled_tokens:sum"] == sum(len(s.tokens) for s in sequences)
    # On-policy the learner is the sampler: its logprobs are the recorded ones.
    for record, seq in zip(out.loss_fn_outputs, sequences, strict=True):
        learner = record["logprobs"].tolist()[len(PROMPT) - 1 :]
        assert learner == pytest.approx(seq.logprobs, abs=1e-4)
    training.forward_backward(honest, "stable_reinforce", {"kl_coeff": 0.1})
    assert training.optim_step(ADAM).result(WAIT_S).metrics["grad_norm"] > 0

    # The step's rollouts: what the sampler drew (no reward: the server never sees one) and
    # the datums trained, each with the advantage it carried.
    session_id = training.model_id.split(":")[0]
    url = f"/runs/{session_id}/rollouts"
    items = wait_for(lambda: server.api.get(url, params={"step": 1}).json()["items"])
    samples = [i for i in items if i["kind"] == "sample"]
    trained = [i for i in items if i["kind"] == "datum"]
    tokenizer = training.get_tokenizer()
    assert [s["completion"] for s in samples] == [tokenizer.decode(s.tokens) for s in sequences]
    assert all(s["reward"] is None and s["finish_reason"] == "length" for s in samples)
    assert [d["advantage"] for d in trained] == pytest.approx(advantages)
    assert trained[0]["completion"] == tokenizer.decode(sequences[0].tokens)
    assert trained[0]["prompt"] == tokenizer.decode(PROMPT)
    # gspo takes the same datums (with its sequence mask) and trains as well.
    gspo = [
        types.Datum(
            model_input=d.model_input,
            loss_fn_inputs={
                **d.loss_fn_inputs,
                "sequence_ratio_mask": [0.0] * (len(PROMPT) - 1) + [1.0] * len(s.tokens),
            },
        )
        for d, s in zip(honest, sequences, strict=True)
    ]
    assert "loss:sum" in training.forward_backward(gspo, "gspo").result(WAIT_S).metrics


def test_sequences_that_are_not_the_sessions_own_are_refused_by_name(
    service: tinker.ServiceClient,
) -> None:
    training = service.create_lora_training_client("tiny-random", rank=4, seed=22).result(WAIT_S)
    plain = draw(training.save_weights_and_get_sampling_client().result(WAIT_S), 1)[0]
    with pytest.raises(tinker.RequestFailedError, match="is not recorded") as unrecorded:
        training.forward([rl_datum(PROMPT, plain, 1.0)], "stable_reinforce").result(WAIT_S)
    assert plain.sequence_id in str(unrecorded.value)
    assert unrecorded.value.category == "user"

    # Another session's recorded sequence is not this one's to train on.
    other = tinker.ServiceClient()
    try:
        theirs = other.create_lora_training_client("tiny-random", rank=4, seed=22).result(WAIT_S)
        sampler = theirs.save_weights_and_get_sampling_client(record_stability_info=True)
        foreign = draw(sampler.result(WAIT_S), 1)[0]
        # The client is poisoned by a failed request: a fresh one for each refusal.
        fresh = service.create_lora_training_client("tiny-random", rank=4, seed=22).result(WAIT_S)
        with pytest.raises(tinker.RequestFailedError, match="not sampled in this session") as err:
            fresh.forward([rl_datum(PROMPT, foreign, 1.0)], "stable_reinforce").result(WAIT_S)
        assert foreign.sequence_id in str(err.value)
        # Its owner trains on it.
        theirs.forward([rl_datum(PROMPT, foreign, 1.0)], "stable_reinforce").result(WAIT_S)
    finally:
        other.close("success").result(WAIT_S)
