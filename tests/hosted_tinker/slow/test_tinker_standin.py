"""The real tinker SDK against the stand-in, the slow tests: its retries on 5xx and 429, and our
wrapper's timeout on an unreachable URL."""

from __future__ import annotations

import asyncio
import time

import pytest
import tinker
from tinker import types

from runners.backends.tinker_backend import TinkerUnreachable, create_tinker_service
from tests.hosted_tinker.conftest import TEST_KEY
from tests.hosted_tinker.test_tinker_standin import (
    BASE_MODEL,
    PPO_CONFIG,
    WAIT_S,
    error_text,
    make_datums,
)
from tests.support.standins.tinker_standin import TinkerStandin


def test_sdk_retries_5xx_and_429(standin: TinkerStandin, sdk: tinker.ServiceClient) -> None:
    # 429 on a JSON endpoint: the SDK's HTTP layer retries (honouring retry-after-ms).
    standin.fail_next("create_model", count=2, status=429, retry_after_s=0.05)
    training = sdk.create_lora_training_client(BASE_MODEL, rank=8).result(WAIT_S)
    assert [r.status for r in standin.requests("create_model")] == [429, 429, 200]

    # 503 twice on the protobuf submit: retried with backoff (0.5 s, 1 s; jittered).
    standin.fail_next("forward_backward", count=2, status=503)
    # 500 on polling: retried at once.
    standin.fail_next("retrieve_future", count=1, status=500)
    started = time.monotonic()
    output = training.forward_backward(make_datums(), "ppo", PPO_CONFIG).result(WAIT_S)
    assert time.monotonic() - started < 15  # backoffs of seconds, not the SDK's minutes
    assert len(output.loss_fn_outputs) == 2
    assert [r.status for r in standin.requests("forward_backward")] == [503, 503, 200]
    # Each retry resends the same request: same seq_id, same data.
    sent = [r.body for r in standin.requests("forward_backward")]
    assert sent[0] == sent[1] == sent[2]

    # Checkpoint saves go out with max_retries=0; the holder's own loop retries (1 s backoff).
    standin.fail_next("save_weights", count=1, status=502)
    path = training.save_state("after-fault").result(WAIT_S).path
    assert path.endswith("/weights/after-fault")

    # 429 on sampling: the sampler backs off about a second and resubmits.
    sampler = training.save_weights_and_get_sampling_client().result(WAIT_S)
    standin.fail_next("asample", count=1, status=429)
    params = types.SamplingParams(max_tokens=3)
    response = sampler.sample(types.ModelInput.from_ints([5]), 2, params).result(WAIT_S)
    assert len(response.sequences) == 2
    assert [r.status for r in standin.requests("asample")] == [429, 200]


def test_wrapper_times_out_on_an_unreachable_url(closed_port_url: str) -> None:
    tinker_service = create_tinker_service(TEST_KEY, closed_port_url, timeout_s=2)
    assert TEST_KEY not in repr(tinker_service)

    started = time.monotonic()
    with pytest.raises(TinkerUnreachable) as caught:
        tinker_service.create_lora_training_client(BASE_MODEL, rank=8).result()
    elapsed = time.monotonic() - started
    assert 1.5 < elapsed < 8  # the 2 s bound, with slack for a busy machine
    assert f"Tinker unreachable at {closed_port_url}" in str(caught.value)
    assert TEST_KEY not in error_text(caught.value)

    async def awaited() -> None:
        await tinker_service.create_sampling_client(base_model=BASE_MODEL)

    started = time.monotonic()
    with pytest.raises(TinkerUnreachable):
        asyncio.run(awaited())
    assert time.monotonic() - started < 8
    tinker_service.close()  # no session was opened: returns at once
