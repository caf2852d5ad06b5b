"""The rest of SDK 0.38's surface through the real SDK (and, for the routes its client/config
keeps it off, its own request types over HTTP): sessions listed, read, searched and moved to a
project; top-k and target prompt logprobs and the prompt's alternative tokens, as the
in-process engine gives them; copies of checkpoints; the batch future poller, cancelling and
joining a sampler; what is not served, refused by name."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker
import torch
from tinker import types
from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss

from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import KEY, WAIT_S
from tests.tinker_api.reference import ADAM, datums, local_service

pytestmark = pytest.mark.timeout(180)
PROMPT = types.ModelInput.from_ints([5, 6, 7, 8, 9, 10])
PARAMS = types.SamplingParams(max_tokens=3, temperature=1.0, seed=4, stop=[])


def api(server: LiveServer, method: str, path: str, **kwargs: object) -> httpx.Response:
    headers = {"X-API-Key": KEY}
    return httpx.request(
        method, f"{server.url}/api/v1/{path}", headers=headers, timeout=60, **kwargs
    )  # type: ignore[arg-type]


def test_sessions_are_listed_read_searched_and_moved(server: LiveServer) -> None:
    named = tinker.ServiceClient(user_metadata={"team": "blue"}, display_name="nightly arith run")
    model = named.create_lora_training_client("tiny-random", rank=4).result(WAIT_S)
    session_id = model.model_id.split(":")[0]
    model.save_weights_and_get_sampling_client().result(WAIT_S)
    rest = tinker.RestClient(base_url=server.url, api_key=KEY)
    assert session_id in rest.list_sessions(limit=100).result(WAIT_S).sessions
    got = rest.get_session(session_id).result(WAIT_S)
    assert got.training_run_ids == [model.model_id] and len(got.sampler_ids) == 1
    assert got.user_metadata == {"team": "blue"} and got.display_name == "nightly arith run"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # search_sessions is experimental in the SDK
        found = rest.search_sessions(
            types.SessionSearchRequest(
                display_name="ARITH nightly", statuses=[types.ActiveSessionStatusQuery()]
            )
        ).result(WAIT_S)
        assert [s.session_id for s in found.sessions] == [session_id]
        assert found.sessions[0].status == types.SessionActive()
        rest.assign_session_project(session_id, "proj-a").result(WAIT_S)
        named.close("success").result(WAIT_S)
        by_project = rest.search_sessions(
            types.SessionSearchRequest(project_ids=["proj-a"], user_metadata={"team": "blue"})
        ).result(WAIT_S)
    [summary] = by_project.sessions
    assert summary.project_id == "proj-a"
    assert summary.status is not None and summary.status.type == "client_finished"
    assert summary.status.reason.type == "success"
    missing = api(server, "GET", "sessions/r-00000000")
    assert missing.status_code == 404 and "session_id" in missing.json()["detail"]


def test_prompt_scores_as_the_engine_gives_them(
    service: tinker.ServiceClient, tmp_path: Path
) -> None:
    remote = service.create_lora_training_client("tiny-random", rank=4, seed=41).result(WAIT_S)
    remote.forward_backward(datums("cross_entropy"), "cross_entropy")
    remote.optim_step(ADAM)
    sampler = remote.save_weights_and_get_sampling_client().result(WAIT_S)
    targets = types.TensorData(data=[6, -1, 7, 3, 8, 9, 9, 1, 10, -1], dtype="int64", shape=[5, 2])
    asks = {
        "include_prompt_logprobs": True,
        "topk_prompt_logprobs": 3,
        "target_prompt_logprobs": targets,
        "prompt_alt_tokens_k": 2,
    }
    got = sampler.sample(PROMPT, 1, PARAMS, **asks).result(WAIT_S)
    local = local_service(tmp_path)
    try:
        here = local.create_lora_training_client("tiny-random", rank=4, seed=41).result()
        here.forward_backward(datums("cross_entropy"), "cross_entropy")
        here.optim_step(ADAM)
        want = (
            here.save_weights_and_get_sampling_client().result().sample(PROMPT, 1, PARAMS, **asks)
        )
        want = want.result()
    finally:
        local.close()
    assert got.topk_prompt_logprobs is not None and got.topk_prompt_logprobs[0] is None
    for g, w in zip(got.topk_prompt_logprobs[1:], want.topk_prompt_logprobs[1:], strict=True):
        assert [t for t, _ in g] == [t for t, _ in w]
        assert [v for _, v in g] == pytest.approx([v for _, v in w], abs=1e-5)
    assert got.target_prompt_logprobs is not None
    scored = got.target_prompt_logprobs.tolist()
    wanted = want.target_prompt_logprobs.tolist()
    assert sum(scored, []) == pytest.approx(sum(wanted, []), abs=1e-5)
    # A target that is the prompt's own next token scores as its prompt logprob; -1 scores 0.
    assert scored[0][0] == pytest.approx(got.prompt_logprobs[1], abs=1e-6) and scored[0][1] == 0
    assert got.prompt_alt_tokens is not None
    assert got.prompt_alt_tokens.tokens.tolist() == want.prompt_alt_tokens.tokens.tolist()
    assert got.prompt_alt_tokens.tokens.shape == [5, 2]


def test_copies_futures_and_what_is_not_served(
    service: tinker.ServiceClient, server: LiveServer
) -> None:
    training = service.create_lora_training_client("tiny-random", rank=4, seed=42).result(WAIT_S)
    training.forward_backward(datums("cross_entropy"), "cross_entropy")
    training.optim_step(ADAM)
    path = training.save_state("to-copy").result(WAIT_S).path
    rest = tinker.RestClient(base_url=server.url, api_key=KEY)
    copied = rest.copy_weights(path, "archive").result(WAIT_S)
    assert copied.endswith("/weights/to-copy") and copied != path
    assert rest.get_weights_info_by_tinker_path(copied).result(WAIT_S).lora_rank == 4
    # A copy is a checkpoint like the source: a new client loads it and computes the same.
    probe = datums("cross_entropy", 5)
    loaded = service.create_training_client_from_state(copied).result(WAIT_S)
    assert (
        loaded.forward(probe, "cross_entropy").result(WAIT_S).metrics
        == training.forward(probe, "cross_entropy").result(WAIT_S).metrics
    )

    # The batch poller, a clone of a sampler, a cancelled future (the SDK's own types parse them).
    sampler = training.save_weights_and_get_sampling_client().result(WAIT_S)
    sampler_id = sampler._sampling_session_id  # noqa: SLF001 (what the SDK would poll)
    joined = api(server, "POST", "join_sampling_session", json={"sampling_session_id": sampler_id})
    assert types.JoinSamplingSessionResponse.model_validate(joined.json()).client_counter == 1
    body = {
        "sampling_session_id": sampler_id,
        "seq_id": 7,
        "num_samples": 1,
        "prompt": PROMPT.model_dump(mode="json"),
        "sampling_params": PARAMS.model_dump(mode="json"),
    }
    request_id = api(server, "POST", "asample", json=body).json()["request_id"]
    target = {"sampling_session_id": sampler_id}
    polled = api(server, "POST", "retrieve_futures", json={"target": target, "timeout": 30})
    page = types.FuturesRetrieveResponse.model_validate(polled.json())
    assert [(c.state, c.request_id) for c in page.completions] == [("finished", request_id)]
    again = {"target": target, "prev_cursor": page.cursor, "timeout": 0}
    assert api(server, "POST", "retrieve_futures", json=again).json()["completions"] == []
    # Long enough to be cancelled before it ends (tiny-random's context is 2048 tokens).
    params = PARAMS.model_copy(update={"max_tokens": 1500}).model_dump(mode="json")
    long = {**body, "seq_id": 8, "num_samples": 2, "sampling_params": params}
    slow = api(server, "POST", "asample", json=long).json()
    cancel = api(server, "POST", "cancel_future", json={"request_id": slow["request_id"]})
    assert cancel.json() == {"cancelled": True}
    cancelled = api(server, "POST", "retrieve_future", json={"request_id": slow["request_id"]})
    assert "cancelled by its client" in cancelled.json()["error"]

    external = api(
        server,
        "POST",
        "save_weights_external",
        json={"model_id": training.model_id, "path": "x", "age_encryption_recipients": ["age1x"]},
    )
    failed = api(server, "POST", "retrieve_future", json=external.json()).json()
    assert (
        failed["category"] == "user" and "age_encryption_recipients: not served" in failed["error"]
    )


def neg_weighted(logprobs: torch.Tensor, weights: torch.Tensor) -> Any:
    loss = -(logprobs * weights).sum() * 0.5 + torch.exp(logprobs).mean()
    return loss, {"custom/neg_weighted:sum": loss}


def test_server_side_custom_losses(service: tinker.ServiceClient, server: LiveServer) -> None:
    """create_custom_loss as the SDK sends it where the server runs the loss: its traced graph,
    rebuilt here; forward_backward(..., "custom") trains as the SDK's client-side run does."""
    ranks = {"logprobs": 1, "weights": 1}
    handle = trace_loss(neg_weighted, ranks, "r-00000000")
    session_id = service.holder.get_session_id()
    body = types.CreateCustomLossRequest(
        session_id=session_id,
        custom_loss_seq_id=0,
        name=handle.name,
        inputs=list(handle.inputs),
        graph=encode_graph(handle),
    ).model_dump(mode="json", exclude_none=True)
    future = api(server, "POST", "create_custom_loss", json=body).json()
    made = api(server, "POST", "retrieve_future", json=future).json()
    created = types.CreateCustomLossResponse.model_validate(made)
    assert created.loss_id == f"{session_id}:loss:0"

    data = datums("cross_entropy", 9)
    on_server = service.create_lora_training_client("tiny-random", rank=4, seed=9).result(WAIT_S)
    on_client = service.create_lora_training_client("tiny-random", rank=4, seed=9).result(WAIT_S)
    got = on_server.forward_backward(data, "custom", {"loss_id": created.loss_id}).result(WAIT_S)
    local = service.create_custom_loss(neg_weighted, ranks).result(WAIT_S)  # client-side here
    want = on_client.forward_backward_custom(data, local).result(WAIT_S)
    assert got.metrics["loss:sum"] == pytest.approx(
        want.metrics["custom/neg_weighted:sum"], rel=1e-5
    )
    assert got.metrics["custom/neg_weighted:sum"] == pytest.approx(got.metrics["loss:sum"])
    steps = [c.optim_step(ADAM) for c in (on_server, on_client)]
    assert steps[0].result(WAIT_S).metrics["grad_norm"] == pytest.approx(
        steps[1].result(WAIT_S).metrics["grad_norm"], rel=1e-4
    )

    # A graph asking for what is not allowed is refused naming it; a loss id of no loss too.
    bad = dict(body, custom_loss_seq_id=1)
    bad["graph"] = {
        "format": 1,
        "nodes": [
            *body["graph"]["nodes"][:2],
            {"op": "call_function", "name": "x", "target": "os.system", "args": ["true"]},
            body["graph"]["nodes"][-1],
        ],
    }
    refused = api(server, "POST", "create_custom_loss", json=bad).json()
    failed = api(server, "POST", "retrieve_future", json=refused).json()
    assert failed["category"] == "user" and "'os.system', which is not among" in failed["error"]
    with pytest.raises(tinker.RequestFailedError, match="is no custom loss of this session"):
        on_server.forward_backward(data, "custom", {"loss_id": "r-00000000:loss:0"}).result(WAIT_S)
