"""Bad input, each answered the way the SDK handles it and saying what to fix: a key that is
not ours (401); an unknown base model (400 at create); a LoRA rank above the engine's
largest (a failed future naming RLCS_MAX_LORA_RANK); wrong loss inputs, a loss or optimizer
the local engine does not have (a failed future, category user, the session going on); a
body that is not a ForwardBackwardRequest (400 naming the field); an unknown future (410,
which makes the SDK send a sampling request again). Nothing of another session changes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import KEY, WAIT_S, tinker_server
from tests.tinker_api.reference import datums

pytestmark = pytest.mark.timeout(180)
TOKEN = "s3cret-token"


def post(server: LiveServer, path: str, **kwargs: object) -> httpx.Response:
    headers = {"X-API-Key": KEY, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return httpx.post(f"{server.url}/api/v1/{path}", headers=headers, timeout=30, **kwargs)  # type: ignore[arg-type]


def test_keys(server: LiveServer) -> None:
    for headers in ({}, {"X-API-Key": "abc"}, {"X-API-Key": "Bearer tml-x"}):
        answer = httpx.post(f"{server.url}/api/v1/client/config", headers=headers, json={})
        assert answer.status_code == 401, headers
        assert "X-API-Key" in answer.json()["detail"] and "tml-" in answer.json()["detail"]
    assert post(server, "client/config", json={}).json()["use_pyqwest_transport"] is False


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server that takes a token, and whose engine has room for no model at all."""
    var = tmp_path_factory.mktemp("tinker-token")
    budget = {"RLCS_TINKER_MEMORY_BUDGET_GB": "0.00001"}  # 10 KiB
    with tinker_server(var, RLCS_API_TOKEN=TOKEN, **budget) as live:
        yield live


def test_with_a_token_the_key_is_tml_and_the_token(small_server: LiveServer) -> None:
    wrong = tinker.ServiceClient(base_url=small_server.url, api_key="tml-guess")
    with pytest.raises(tinker.AuthenticationError, match="tml-<the server's RLCS_API_TOKEN>"):
        wrong.create_lora_training_client("tiny-random").result(WAIT_S)
    right = tinker.ServiceClient(base_url=small_server.url, api_key=f"tml-{TOKEN}")
    # Through: refused by the memory budget instead, saying what is loaded.
    with pytest.raises(tinker.RequestFailedError, match="memory budget.*loaded now: nothing"):
        right.create_lora_training_client("tiny-random").result(WAIT_S)
    right.close("success").result(WAIT_S)
    # Our own routes still take the bearer token, not the SDK's key.
    assert (
        httpx.get(f"{small_server.url}/runs", headers={"X-API-Key": f"tml-{TOKEN}"}).status_code
        == 401
    )


def test_refusals_leave_the_session_and_others_as_they_were(
    server: LiveServer, service: tinker.ServiceClient
) -> None:
    other_service = tinker.ServiceClient()
    other = other_service.create_lora_training_client("tiny-random", rank=4, seed=8).result(WAIT_S)
    probe = datums("cross_entropy", 8)
    before = other.forward(probe, "cross_entropy").result(WAIT_S)

    with pytest.raises(
        tinker.BadRequestError, match="base_model: 'no/such-model-xyz'.*tiny-random"
    ):
        service.create_lora_training_client("no/such-model-xyz").result(WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match=r"lora_rank 256 .*RLCS_MAX_LORA_RANK"):
        service.create_lora_training_client("tiny-random", rank=256).result(WAIT_S)
    training = service.create_lora_training_client("tiny-random", rank=4, seed=2).result(WAIT_S)

    wrong_keys = datums("cross_entropy")  # weights: fine for cross_entropy, unknown for ppo
    with pytest.raises(
        tinker.RequestFailedError, match="unknown key 'weights' for loss 'ppo'"
    ) as e:
        training.forward_backward(wrong_keys, "ppo").result(WAIT_S)
    assert e.value.category == types.RequestErrorCategory.User
    short = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]},
    )
    with pytest.raises(tinker.RequestFailedError, match=r"expected \(3,\)"):
        training.forward_backward([short], "cross_entropy").result(WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match="'loss_id'.* is no custom loss of this"):
        training.forward_backward(datums("ppo"), "custom").result(WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match="unknown key 'weights' for loss 'gspo'"):
        training.forward_backward(datums("cross_entropy"), "gspo").result(WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match="'stable_reinforce' needs provenance"):
        training.forward_backward(datums("ppo"), "stable_reinforce").result(WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match="Dimuon .* is not served.*AdamParams"):
        training.optim_step(types.DimuonParams(learning_rate=0.01)).result(WAIT_S)
    with pytest.raises(tinker.BadRequestError, match="optimizer_config: Dimuon .* is not served"):
        service.create_lora_training_client(
            "tiny-random", rank=4, optimizer=types.DimuonOptimizerConfig()
        ).result(WAIT_S)
    sampler = training.save_weights_and_get_sampling_client().result(WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match="topk_sample_logprobs is not served"):
        sampler.sample(
            types.ModelInput.from_ints([1, 2]),
            1,
            types.SamplingParams(max_tokens=2),
            topk_sample_logprobs=2,
        ).result(WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match=r"target_prompt_logprobs: token ids"):
        sampler.sample(
            types.ModelInput.from_ints([1, 2]),
            1,
            types.SamplingParams(max_tokens=2),
            target_prompt_logprobs=types.TensorData(data=[10**6], dtype="int64", shape=[1, 1]),
        ).result(WAIT_S)

    # The session goes on, and the other one never noticed.
    assert training.forward_backward(datums("ppo"), "ppo").result(WAIT_S).metrics["loss:sum"]
    after = other.forward(probe, "cross_entropy").result(WAIT_S)
    # The same weights: the same loss, but for the last bits a pass beside another's takes
    # its rows in other micro-batches (the engine's training lanes).
    assert after.metrics == pytest.approx(before.metrics, rel=1e-6)
    other_service.close("success").result(WAIT_S)


def test_bodies_that_do_not_parse(server: LiveServer, service: tinker.ServiceClient) -> None:
    training = service.create_lora_training_client("tiny-random", rank=4).result(WAIT_S)
    proto = {"Content-Type": "application/x-protobuf"}
    garbage = post(server, "forward_backward", content=b"\xff\xff\xff", headers=proto)
    assert garbage.status_code == 400 and garbage.json()["detail"].startswith("body:")

    model = training.model_id.encode()
    header = b"\x0a" + bytes([len(model)]) + model + b"\x10\x07"  # model_id, seq_id 7
    broken_data = header + b"\x1a\x03\xff\xff\xff"  # field 3 (data): not a Datum
    answer = post(server, "forward_backward", content=broken_data, headers=proto)
    assert answer.status_code == 400
    assert "not a tinker ForwardBackwardRequest" in answer.json()["detail"]
    # A dense tensor whose bytes are no whole number of float32 values.
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardRequest(model_id=training.model_id, seq_id=8, loss_fn="cross_entropy")
    datum = msg.data.add()
    datum.model_input.add().encoded_text.tokens = np.asarray([1, 2], np.int32).tobytes()
    datum.loss_fn_inputs["weights"].dense = b"\x00" * 7
    datum.loss_fn_inputs["weights"].dtype = pb.DTYPE_FLOAT32
    answer = post(server, "forward_backward", content=msg.SerializeToString(), headers=proto)
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("data[0].loss_fn_inputs['weights'].dense: 7 bytes")
    as_json = post(server, "forward_backward", json={"model_id": training.model_id})
    assert as_json.status_code == 400 and "protobuf" in as_json.json()["detail"]
    # None of it reached the model: it trains on.
    assert training.forward_backward(datums("cross_entropy"), "cross_entropy").result(WAIT_S)


def test_unknown_futures_and_sessions(server: LiveServer) -> None:
    gone = post(server, "retrieve_future", json={"request_id": "r-00000000:train:abc"})
    assert gone.status_code == 410 and "unknown or its result expired" in gone.json()["detail"]
    beat = post(server, "session_heartbeat", json={"session_id": "r-00000000"})
    assert beat.status_code == 410
    missing = post(
        server,
        "create_model",
        json={"session_id": "r-00000000", "model_seq_id": 0, "base_model": "tiny-random"},
    )
    assert missing.status_code == 404 and "start a new ServiceClient" in missing.json()["detail"]
    bad = post(server, "create_model", json={"session_id": "r-00000000"})
    assert bad.status_code == 422 and "model_seq_id" in bad.json()["detail"]
