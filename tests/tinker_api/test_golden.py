"""What a Tinker SDK session is answered, call by call, against a record taken before the Tinker
API's wire was typed (issue 34): every JSON answer's shape (keys, value types, the values that
do not depend on ids, clocks or float rounding), every protobuf answer's fields, and the run
the session became (/runs, /runs/{id}, its history and checkpoints, /config).

RLCS_GOLDEN_WRITE=<file> writes the answers instead, with every number kept: two such files,
one taken before a change and one after, on one machine, must be equal (`diff`).
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tinker
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

from tests.support.fault_proxy import Exchange, FaultProxy
from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import KEY, WAIT_S, tinker_server
from tests.tinker_api.reference import ADAM, datums

pytestmark = [pytest.mark.timeout(240), pytest.mark.filterwarnings("ignore::FutureWarning")]
GOLDEN = Path(__file__).with_name("golden_answers.json")
# Asked again and again, as often as timing has it: not part of the record.
NOISE = ("/api/v1/session_heartbeat", "/api/v1/telemetry")
IDS = [
    (re.compile(r"r-[0-9a-f]{8}"), "r-ID"),
    (re.compile(r"r-ID:([a-z_]+):[0-9a-f]{16}"), r"r-ID:\1:HEX"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?"), "TIME"),
    (re.compile(r"/[^\s\"']*/(runs|models)/"), r"/VAR/\1/"),
]
# Values of a clock or a process: the same call answers others each time.
VOLATILE = {"pid", "config_hash", "time_per_step_s", "time/step", "size_bytes"}


def session(url: str) -> None:
    """One script's session: every operation the SDK has here, each waited for in turn."""
    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    try:
        service.get_server_capabilities()
        training = service.create_lora_training_client("tiny-random", rank=4, seed=5).result(WAIT_S)
        training.get_info()
        data = datums("importance_sampling", 5)
        training.forward_backward(data, "importance_sampling").result(WAIT_S)
        training.optim_step(ADAM).result(WAIT_S)
        training.forward(data, "importance_sampling").result(WAIT_S)
        state = training.save_state("golden").result(WAIT_S)
        with pytest.raises(tinker.RequestFailedError):
            training.save_state("golden").result(WAIT_S)  # exists: a failed future
        sampler_path = training.save_weights_for_sampler("golden-sampler").result(WAIT_S).path
        params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3, stop=[])
        prompt = types.ModelInput.from_ints([5, 17, 42, 9])
        snapshot = training.save_weights_and_get_sampling_client().result(WAIT_S)
        snapshot.sample(prompt, 2, params, include_prompt_logprobs=True).result(WAIT_S)
        saved = service.create_sampling_client(model_path=sampler_path)
        saved.sample(prompt, 1, params).result(WAIT_S)
        base = service.create_sampling_client(base_model="tiny-random")
        base.sample(prompt, 1, params).result(WAIT_S)
        loaded = service.create_training_client_from_state_with_optimizer(state.path).result(WAIT_S)
        loaded.forward_backward(data, "importance_sampling").result(WAIT_S)
        training.load_state(state.path).result(WAIT_S)  # the deprecated form
        with pytest.raises(tinker.RequestFailedError):
            missing = f"tinker://{training.model_id}/weights/never-saved"
            service.create_training_client_from_state(missing).result(WAIT_S)
        rest = service.create_rest_client()
        rest.list_training_runs().result(WAIT_S)
        rest.get_training_run(training.model_id).result(WAIT_S)
        rest.list_checkpoints(training.model_id).result(WAIT_S)
        rest.list_user_checkpoints().result(WAIT_S)
        rest.get_weights_info_by_tinker_path(state.path).result(WAIT_S)
    finally:
        service.close("success").result(WAIT_S)


def record(server: LiveServer) -> list[Any]:
    with FaultProxy(server.url) as proxy:
        session(proxy.url)
        # Refusals (HTTP errors), asked as any client might.
        with httpx.Client(base_url=proxy.url, headers={"X-API-Key": KEY}) as client:
            proto = {"Content-Type": "application/x-protobuf"}
            client.post("/api/v1/forward_backward", content=b"\xff\x01", headers=proto)
            client.post("/api/v1/get_info", json={"model_id": "r-00000000:train:0"})
        exchanges = [e for e in proxy.exchanges if e.path not in NOISE]
    run_id = _run_id(exchanges)
    api = server.api
    runs = [r for r in api.get("/runs").json() if r["run_id"] == run_id]
    ours: list[Any] = [_answer(e) for e in exchanges if not _try_again(e)]
    selected = api.post("/environments/arithmetic/select").json()
    ours += [
        {"POST /environments/arithmetic/select": selected},
        {"GET /config": api.get("/config").json()},
        {"GET /runs (its entry)": runs},
        {"GET /runs/{id}": api.get(f"/runs/{run_id}").json()},
        {"GET /runs/{id}/history": api.get(f"/runs/{run_id}/history").json()},
        {"GET /runs/{id}/checkpoints": api.get(f"/runs/{run_id}/checkpoints").json()},
    ]
    return ours


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of its own: the RestClient's lists hold this session's models only."""
    with tinker_server(tmp_path_factory.mktemp("tinker-golden")) as live:
        yield live


def test_a_session_is_answered_as_before(alone: LiveServer) -> None:
    answers = record(alone)
    written = os.environ.get("RLCS_GOLDEN_WRITE")
    if written:
        Path(written).write_text(json.dumps(_ids(answers), indent=1, sort_keys=True) + "\n")
        pytest.skip(f"answers written to {written}")
    want = json.loads(GOLDEN.read_text())
    got = shape(_ids(answers))
    assert [next(iter(a)) for a in got] == [next(iter(a)) for a in want]  # the calls, in order
    for one, golden in zip(got, want, strict=True):
        assert one == golden


def shape(value: Any) -> Any:
    """What does not depend on the machine: floats become their type's name, and so do the
    tokens sampled (a float's last bit may pick another token on another CPU)."""
    if isinstance(value, dict):
        return {
            key: ["<int>"] * len(item)
            if key == "tokens" and isinstance(item, list)
            else shape(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [shape(item) for item in value]
    if isinstance(value, float):
        return "<float>"
    return value


def _answer(exchange: Exchange) -> dict[str, Any]:
    call = f"{exchange.method} {exchange.path}"
    if "protobuf" in exchange.content_type:
        kind = json.loads(exchange.body)["request_id"].split(":")[1]
        message = pb.SampleResponse() if kind == "sample" else pb.ForwardBackwardOutput()
        message.ParseFromString(exchange.answer)
        return {call: {"status": exchange.status, "protobuf": _decoded(message)}}
    return {call: {"status": exchange.status, "json": json.loads(exchange.answer)}}


def _decoded(message: Any) -> Any:
    """A protobuf answer as JSON, its packed arrays read as numbers."""
    plain = MessageToDict(message, preserving_proto_field_name=True)
    if isinstance(message, pb.SampleResponse):
        for seq in plain.get("sequences", []):
            seq["tokens"] = _array(seq["tokens"], "<i4")
            seq["logprobs"] = _array(seq.get("logprobs", ""), "<f4")
        if "prompt_logprobs" in plain:
            values = _array(plain["prompt_logprobs"], "<f4")
            plain["prompt_logprobs"] = [None if v != v else v for v in values]  # NaN: none
        return plain
    for record in plain.get("loss_fn_outputs", []):
        for name, field in record["fields"].items():
            kind = "<f4" if field["dtype"] == "DTYPE_FLOAT32" else "<i8"
            record["fields"][name] = {
                "dtype": field["dtype"],
                "data": _array(field["data"], kind),
                "offsets": _array(field["offsets"], "<i8"),
            }
    return plain


def _array(encoded: str, dtype: str) -> list[Any]:
    return np.frombuffer(base64.b64decode(encoded), dtype=dtype).tolist()


def _try_again(exchange: Exchange) -> bool:
    return "json" in exchange.content_type and b'"try_again"' in exchange.answer


def _run_id(exchanges: list[Exchange]) -> str:
    for exchange in exchanges:
        if exchange.path == "/api/v1/create_session":
            return str(json.loads(exchange.answer)["session_id"])
    raise AssertionError("no create_session among the calls")


def _ids(value: Any) -> Any:
    text = json.dumps(_steady(value))
    for pattern, replacement in IDS:
        text = pattern.sub(replacement, text)
    return json.loads(text)


def _steady(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "<varies>" if k in VOLATILE else _steady(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_steady(item) for item in value]
    return value
