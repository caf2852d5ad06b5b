"""A forward_backward whose answer was lost is sent again by the SDK with the same sequence id:
the server answers it with the first request's future, and the work is done once."""

from __future__ import annotations

import json

import pytest
import tinker

from tests.support.fault_proxy import FaultProxy
from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import KEY, WAIT_S
from tests.tinker_api.reference import ADAM, datums

pytestmark = pytest.mark.timeout(180)


def test_a_retried_forward_backward_is_applied_once(server: LiveServer) -> None:
    data = datums("cross_entropy", 4)
    with FaultProxy(server.url) as proxy:
        service = tinker.ServiceClient(base_url=proxy.url, api_key=KEY)
        try:
            training = service.create_lora_training_client("tiny-random", rank=4, seed=4).result(
                WAIT_S
            )
            proxy.drop_next("/api/v1/forward_backward")
            proxy.drop_next("/api/v1/optim_step")
            fb = training.forward_backward(data, "cross_entropy")
            step = training.optim_step(ADAM)
            loss = fb.result(WAIT_S).metrics["loss:sum"]
            step.result(WAIT_S)
        finally:
            service.close("success").result(WAIT_S)

    # The server did the first request; the client never saw its answer and sent it again,
    # and got the same future back.
    for path in ("/api/v1/forward_backward", "/api/v1/optim_step"):
        (lost,) = [json.loads(body) for p, body in proxy.dropped if p == path]
        again = [json.loads(body) for p, body in proxy.passed if p == path]
        assert again == [lost]

    run_id = training.model_id.split(":")[0]
    (row,) = server.api.get(f"/runs/{run_id}/history").json()["rows"]
    # One forward_backward's tokens and loss in the step, one optimizer step.
    assert row["train/tokens"] == sum(d.model_input.length for d in data)
    assert row["train/loss"] == pytest.approx(loss, rel=1e-6)
    assert server.api.get(f"/runs/{run_id}").json()["step"] == 1
