"""Loopback stand-in for the hosted Tinker API, speaking the wire format of the tinker SDK 0.38.

The unmodified SDK drives it end to end over HTTP on 127.0.0.1. Every request is recorded in
decoded form, and latency, HTTP faults, slow futures and failed futures can be injected.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from tests.support.standins.loopback import LoopbackServer

PROTO_CONTENT_TYPE = "application/x-protobuf"
JSON_CONTENT_TYPE = "application/json"
API_PREFIX = "/api/v1/"
VOCAB_SIZE = 1000
DEFAULT_MAX_TOKENS = 16

# Endpoints a client hits on its own (setup, keep-alive, polling); `calls()` leaves them out.
HOUSEKEEPING = frozenset(
    {
        "client/config",
        "client/dynamic_config",
        "session_heartbeat",
        "telemetry",
        "retrieve_future",
    }
)

RL_LOSSES = frozenset({"importance_sampling", "ppo", "cispo", "dro"})
# What the hosted service accepts per loss; it rejects unknown keys, so the stand-in does too.
LOSS_INPUT_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "cross_entropy": (frozenset({"target_tokens", "weights"}), frozenset()),
    **{
        name: (frozenset({"target_tokens", "logprobs", "advantages"}), frozenset())
        for name in RL_LOSSES
    },
    "gspo": (
        frozenset({"target_tokens", "logprobs", "advantages"}),
        frozenset({"sequence_ratio_mask"}),
    ),
}
# Server-defined losses: accepted without checking inputs or computing a loss.
OPAQUE_LOSSES = frozenset({"stable_reinforce", "custom"})

_PROTO_DTYPES: dict[int, tuple[str, type]] = {
    pb.DTYPE_FLOAT32: ("float32", np.float32),
    pb.DTYPE_INT64: ("int64", np.int64),
    pb.DTYPE_INT32: ("int32", np.int32),
}

SampleFn = Callable[[list[int], int, Mapping[str, Any]], list[int]]

# What the hosted service listed in its model lineup (tinker-docs "Model Lineup", 2026): its
# families are Qwen3 and Llama 3. Tests add the names they train on (e.g. "tiny-random").
HOSTED_MODELS = (
    "Qwen/Qwen3-VL-235B-A22B-Instruct",
    "Qwen/Qwen3-VL-30B-A3B-Instruct",
    "Qwen/Qwen3-235B-A22B-Instruct-2507",
    "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-30B-A3B-Base",
    "Qwen/Qwen3-32B",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-8B-Base",
    "Qwen/Qwen3-4B-Instruct-2507",
    "meta-llama/Llama-3.3-70B-Instruct",
    "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.2-3B",
    "meta-llama/Llama-3.2-1B",
)


def token_logprob(token: int) -> float:
    """The stand-in model's logprob of any token: a fixed function tests can recompute."""
    return -0.5 * (1 + int(token) % 3)


def default_sample_tokens(prompt: list[int], index: int, params: Mapping[str, Any]) -> list[int]:
    """Deterministic completion number `index` of `prompt` (before stop/max_tokens handling)."""
    max_tokens = params.get("max_tokens") or DEFAULT_MAX_TOKENS
    seed = sum(prompt) + 7 * index
    return [(seed + 3 * j + 1) % VOCAB_SIZE for j in range(max_tokens)]


def answering_with(words: list[str], tokenizer: Any) -> SampleFn:
    """A `sample_fn` whose every completion is one of `words` (drawn anew each time, so a
    group's scores differ) and the end-of-text token."""
    calls = itertools.count()

    def answer(prompt: list[int], index: int, params: Mapping[str, Any]) -> list[int]:
        word = random.Random(next(calls)).choice(words)
        return list(tokenizer.encode(word, add_special_tokens=False)) + [tokenizer.eos_token_id]

    return answer


@dataclass
class RecordedRequest:
    """One request as the stand-in received it, decoded, with the status it answered."""

    index: int
    method: str
    endpoint: str  # path after /api/v1/, ids folded: "finish_session", "get_sampler"
    path: str
    body: dict[str, Any]
    status: int
    at: float  # time.monotonic() when it arrived
    api_key: str | None = field(default=None, repr=False)
    fault: bool = False  # answered by an injected fault


@dataclass
class _Fault:
    status: int
    remaining: int
    retry_after_s: float | None
    detail: str


@dataclass
class _Future:
    kind: str
    content_type: str = JSON_CONTENT_TYPE
    payload: bytes = b""
    error: tuple[str, str] | None = None  # (message, category)
    polls_left: int = 0


@dataclass
class _Model:
    model_id: str
    base_model: str
    rank: int
    seed: int | None
    optimizer_restored: bool = False
    steps: int = 0


class _StandinError(Exception):
    """An HTTP error answer (as opposed to a failed future)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class _UserError(Exception):
    """A request the hosted service accepts but whose future then fails with category user."""


class TinkerStandin(LoopbackServer):
    """A fake Tinker API on 127.0.0.1. Use as a context manager, or call start() and stop().

    Attributes tests may set at any time: `latency_s` (sleep before every answer),
    `endpoint_latency_s` (per endpoint, added), `pending_polls` (try_again answers each future
    gives before its result), `sample_fn` (completion tokens), `expected_api_key`,
    `supported_models` (the capabilities list; create_model refuses other base models).
    """

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        pending_polls: int = 0,
        sample_fn: SampleFn | None = None,
        expected_api_key: str | None = None,
        client_config: Mapping[str, Any] | None = None,
        extra_models: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.supported_models: list[str] = [*HOSTED_MODELS, *extra_models]
        self.latency_s = latency_s
        self.endpoint_latency_s: dict[str, float] = {}
        self.pending_polls = pending_polls
        self.sample_fn: SampleFn = sample_fn or default_sample_tokens
        self.expected_api_key = expected_api_key
        # Plain httpx transport and no JWT exchange: what the stand-in implements.
        self.client_config: dict[str, Any] = {
            "pjwt_auth_enabled": False,
            "use_pyqwest_transport": False,
            "sample_use_retrieve_futures": False,
            "sample_join_sampling_session": False,
            "custom_loss_server_side": False,
            "proto_compress_fwdbwd": False,
            **(client_config or {}),
        }
        self._lock = threading.Lock()
        self._records: list[RecordedRequest] = []
        self._faults: dict[str, _Fault] = {}
        self._future_faults: dict[str, list[tuple[str, str]]] = {}
        self._futures: dict[str, _Future] = {}
        self._models: dict[str, _Model] = {}
        self._checkpoints: dict[str, _Model] = {}  # tinker:// path -> model state saved there
        self._samplers: dict[str, tuple[str, str | None]] = {}  # id -> (base_model, model_path)
        # save_weights_external: tinker:// path -> {file: bytes}; signed download token -> file.
        self.external: dict[str, dict[str, bytes]] = {}
        self._downloads: dict[str, bytes] = {}
        self._ids = itertools.count(1)

    # ---- what tests read -------------------------------------------------------------------

    def requests(self, endpoint: str | None = None) -> list[RecordedRequest]:
        """Recorded requests in arrival order, optionally only those to one endpoint."""
        with self._lock:
            return [r for r in self._records if endpoint is None or r.endpoint == endpoint]

    def bodies(self, endpoint: str) -> list[dict[str, Any]]:
        """Decoded bodies of the requests to `endpoint` that were answered (not faulted)."""
        return [r.body for r in self.requests(endpoint) if not r.fault]

    def calls(self, include_housekeeping: bool = False) -> list[str]:
        """Endpoint names in arrival order (faulted ones included), without housekeeping."""
        return [
            r.endpoint
            for r in self.requests()
            if include_housekeeping or r.endpoint not in HOUSEKEEPING
        ]

    def clear(self) -> None:
        """Forget the recorded requests (models, checkpoints and futures stay)."""
        with self._lock:
            self._records.clear()

    # ---- fault injection -------------------------------------------------------------------

    def fail_next(
        self,
        endpoint: str,
        count: int = 1,
        status: int = 500,
        *,
        retry_after_s: float | None = None,
        detail: str = "injected fault",
    ) -> None:
        """Answer the next `count` requests to `endpoint` with HTTP `status` (JSON detail).

        `retry_after_s` adds a `retry-after-ms` header, which the SDK's HTTP layer honours.
        """
        with self._lock:
            self._faults[endpoint] = _Fault(status, count, retry_after_s, detail)

    def fail_next_future(
        self, endpoint: str, message: str = "injected failure", category: str = "server"
    ) -> None:
        """Make the next future created by `endpoint` resolve to an error (RequestFailedError)."""
        with self._lock:
            self._future_faults.setdefault(endpoint, []).append((message, category))

    # ---- HTTP plumbing ---------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        arrived = time.monotonic()
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        if handler.headers.get("Content-Encoding", "").lower() == "zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 30)
        path = urlsplit(handler.path).path
        endpoint = _endpoint_name(path)
        api_key = handler.headers.get("X-API-Key")

        delay = self.latency_s + self.endpoint_latency_s.get(endpoint, 0.0)
        if delay > 0:
            time.sleep(delay)

        status, content_type, payload, extra_headers = 200, JSON_CONTENT_TYPE, b"", {}
        body: dict[str, Any] = {}
        faulted = False
        try:
            body = self._decode(endpoint, handler.headers.get("Content-Type", ""), raw)
            if endpoint != "download":  # a signed URL carries its own token, not the key
                self._check_key(api_key)
            fault = self._take_fault(endpoint)
            if fault is not None:
                faulted = True
                status, payload = fault.status, _json({"detail": fault.detail})
                if fault.retry_after_s is not None:
                    extra_headers["retry-after-ms"] = str(int(fault.retry_after_s * 1000))
            else:
                content_type, payload = self._route(method, endpoint, path, body)
        except _StandinError as e:
            status, content_type, payload = e.status, JSON_CONTENT_TYPE, _json({"detail": e.detail})
        except Exception as e:
            # A stand-in bug must fail the test at once: 422 is the one status the SDK never
            # retries (a 500 would be retried for minutes).
            status, content_type = 422, JSON_CONTENT_TYPE
            payload = _json({"detail": f"stand-in error: {type(e).__name__}: {e}"})

        # Recorded before answering, so a test that has the SDK's result also sees the request.
        with self._lock:
            self._records.append(
                RecordedRequest(
                    index=len(self._records),
                    method=method,
                    endpoint=endpoint,
                    path=path,
                    body=body,
                    status=status,
                    at=arrived,
                    api_key=api_key,
                    fault=faulted,
                )
            )
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(payload)))
        for name, value in extra_headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(payload)

    def _check_key(self, api_key: str | None) -> None:
        if not api_key or not api_key.startswith(("tml-", "eyJ")):
            raise _StandinError(401, "missing or malformed X-API-Key")
        if self.expected_api_key is not None and api_key != self.expected_api_key:
            raise _StandinError(401, "API key not recognised")

    def _take_fault(self, endpoint: str) -> _Fault | None:
        with self._lock:
            fault = self._faults.get(endpoint)
            if fault is None:
                return None
            fault.remaining -= 1
            if fault.remaining <= 0:
                del self._faults[endpoint]
            return fault

    @staticmethod
    def _decode(endpoint: str, content_type: str, raw: bytes) -> dict[str, Any]:
        if PROTO_CONTENT_TYPE in content_type:
            if endpoint != "forward_backward":
                raise _StandinError(415, f"protobuf body not expected on {endpoint}")
            msg = pb.ForwardBackwardRequest()
            msg.ParseFromString(raw)
            return _decode_forward_backward(msg)
        if not raw:
            return {}
        try:
            decoded = json.loads(raw)
        except ValueError as e:
            raise _StandinError(400, f"body is not JSON: {e}") from e
        return decoded if isinstance(decoded, dict) else {"_": decoded}

    # ---- endpoints -------------------------------------------------------------------------

    def _route(
        self, method: str, endpoint: str, path: str, body: dict[str, Any]
    ) -> tuple[str, bytes]:
        if method == "GET" and endpoint == "get_server_capabilities":
            models = [
                {
                    "model_name": name,
                    "max_context_length": 32768,
                    "trainable": True,
                    "sampleable": True,
                }
                for name in self.supported_models
            ]
            return JSON_CONTENT_TYPE, _json({"supported_models": models})
        if method == "GET" and endpoint == "get_sampler":
            sampler_id = path.rsplit("/", 1)[-1]
            with self._lock:
                sampler = self._samplers.get(sampler_id)
            if sampler is None:
                raise _StandinError(404, f"unknown sampler {sampler_id}")
            base_model, model_path = sampler
            return JSON_CONTENT_TYPE, _json(
                {"sampler_id": sampler_id, "base_model": base_model, "model_path": model_path}
            )
        if method == "GET" and endpoint == "external_weights_urls":
            return JSON_CONTENT_TYPE, _json(self._external_weights_urls(path))
        if method == "GET" and endpoint == "download":
            with self._lock:
                data = self._downloads.get(path.split("/")[2])
            if data is None:
                raise _StandinError(403, "unknown or expired download URL")
            return "application/octet-stream", data
        if method != "POST":
            raise _StandinError(404, f"no route for {method} {path}")

        simple: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "client/config": lambda b: dict(self.client_config),
            "client/dynamic_config": lambda b: {},
            "create_session": self._create_session,
            "session_heartbeat": lambda b: {"type": "session_heartbeat"},
            "telemetry": lambda b: {"status": "accepted"},
            "finish_session": lambda b: {},
            "get_info": self._get_info,
            "create_sampling_session": self._create_sampling_session,
            "create_model": self._create_model,
            "forward_backward": self._forward_backward,
            "optim_step": self._optim_step,
            "save_weights": self._save_weights,
            "save_weights_for_sampler": self._save_weights_for_sampler,
            "load_weights": self._load_weights,
            "save_weights_external": self._save_weights_external,
            "asample": self._asample,
        }
        if endpoint == "retrieve_future":
            return self._retrieve_future(body)
        handler = simple.get(endpoint)
        if handler is None:
            raise _StandinError(404, f"the Tinker stand-in has no endpoint {path}")
        return JSON_CONTENT_TYPE, _json(handler(body))

    def _new_future(self, kind: str, make: Callable[[], tuple[str, bytes]]) -> str:
        request_id = f"standin-req-{next(self._ids)}"
        future = _Future(kind=kind, polls_left=self.pending_polls)
        with self._lock:
            injected = self._future_faults.get(kind)
            if injected:
                future.error = injected.pop(0)
        if future.error is None:
            try:
                future.content_type, future.payload = make()
            except _UserError as e:
                future.error = (str(e), "user")
        with self._lock:
            self._futures[request_id] = future
        return request_id

    def _retrieve_future(self, body: dict[str, Any]) -> tuple[str, bytes]:
        request_id = str(body.get("request_id"))
        with self._lock:
            future = self._futures.get(request_id)
            if future is None:
                raise _StandinError(404, f"unknown request_id {request_id}")
            if future.polls_left > 0:
                future.polls_left -= 1
                return JSON_CONTENT_TYPE, _json({"type": "try_again", "queue_state": "active"})
        if future.error is not None:
            message, category = future.error
            return JSON_CONTENT_TYPE, _json({"error": message, "category": category})
        return future.content_type, future.payload

    def _create_session(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"type": "create_session", "session_id": f"standin-session-{next(self._ids)}"}

    def _model(self, model_id: Any) -> _Model:
        with self._lock:
            model = self._models.get(str(model_id))
        if model is None:
            raise _StandinError(404, f"unknown model_id {model_id}")
        return model

    def _get_info(self, body: dict[str, Any]) -> dict[str, Any]:
        model = self._model(body.get("model_id"))
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_data": {
                "arch": "standin",
                "model_name": model.base_model,
                "tokenizer_id": model.base_model,
            },
            "is_lora": True,
            "lora_rank": model.rank,
            "model_name": model.base_model,
        }

    def _create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        base_model = body.get("base_model")
        if not base_model:
            raise _StandinError(400, "base_model is required")
        if base_model not in self.supported_models:
            # The hosted service refuses at once, with a 400 the SDK does not retry.
            raise _StandinError(400, f"base_model {base_model!r} is not supported")
        lora = body.get("lora_config") or {}
        model_id = f"{body.get('session_id')}:train:{body.get('model_seq_id')}"
        model = _Model(model_id, str(base_model), int(lora.get("rank", 32)), lora.get("seed"))
        with self._lock:
            self._models[model_id] = model
        request_id = self._new_future(
            "create_model",
            lambda: (JSON_CONTENT_TYPE, _json({"model_id": model_id, "type": "create_model"})),
        )
        return {"request_id": request_id, "model_id": model_id}

    def _forward_backward(self, body: dict[str, Any]) -> dict[str, Any]:
        self._model(body.get("model_id"))
        request_id = self._new_future(
            "forward_backward",
            lambda: (PROTO_CONTENT_TYPE, _forward_backward_output(body).SerializeToString()),
        )
        return {"request_id": request_id, "model_id": body.get("model_id")}

    def _optim_step(self, body: dict[str, Any]) -> dict[str, Any]:
        model = self._model(body.get("model_id"))
        params = body.get("adam_params") or body.get("optimizer_params") or {}
        with self._lock:
            model.steps += 1
        metrics = {"learning_rate": float(params.get("learning_rate", 0.0))}
        request_id = self._new_future(
            "optim_step", lambda: (JSON_CONTENT_TYPE, _json({"metrics": metrics}))
        )
        return {"request_id": request_id, "model_id": model.model_id}

    def _save_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        model = self._model(body.get("model_id"))
        name = body.get("path")
        if not name:
            raise _StandinError(400, "save_weights needs a name (path)")
        path = f"tinker://{model.model_id}/weights/{name}"

        def make() -> tuple[str, bytes]:
            # A failed future, not an HTTP 409: the SDK retries a 409 for minutes.
            with self._lock:
                if path in self._checkpoints and not body.get("overwrite"):
                    raise _UserError(f"checkpoint {path} exists; pass overwrite=True")
                saved = _Model(model.model_id, model.base_model, model.rank, None)
                self._checkpoints[path] = saved
            return JSON_CONTENT_TYPE, _json({"path": path, "type": "save_weights"})

        request_id = self._new_future("save_weights", make)
        return {"request_id": request_id, "model_id": model.model_id}

    def _save_weights_for_sampler(self, body: dict[str, Any]) -> dict[str, Any]:
        model = self._model(body.get("model_id"))
        name = body.get("path")
        if name:
            path = f"tinker://{model.model_id}/sampler_weights/{name}"
            result: dict[str, Any] = {"path": path, "type": "save_weights_for_sampler"}
            with self._lock:
                self._checkpoints[path] = _Model(model.model_id, model.base_model, model.rank, None)
        else:
            # Ephemeral snapshot (save_weights_and_get_sampling_client): a sampler id, no path.
            sampler_id = f"{model.model_id}:sample:{body.get('sampling_session_seq_id')}"
            result = {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}
            with self._lock:
                self._samplers[sampler_id] = (model.base_model, None)
        request_id = self._new_future(
            "save_weights_for_sampler", lambda: (JSON_CONTENT_TYPE, _json(result))
        )
        return {"request_id": request_id, "model_id": model.model_id}

    def _load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        # create_training_client_from_state(_with_optimizer) sends this with session_id and
        # model_seq_id (a new model whose first request is the load); the deprecated
        # load_state sends model_id and seq_id instead.
        path = str(body.get("path"))
        if body.get("model_id"):
            model_id = str(body["model_id"])
        else:
            model_id = f"{body.get('session_id')}:train:{body.get('model_seq_id')}"

        def make() -> tuple[str, bytes]:
            with self._lock:
                saved = self._checkpoints.get(path)
            if saved is None or "/weights/" not in path:
                raise _UserError(f"no training checkpoint at {path} (save_state makes one)")
            restored = _Model(
                model_id,
                body.get("base_model") or saved.base_model,
                saved.rank,
                None,
                optimizer_restored=bool(body.get("optimizer")),
            )
            with self._lock:
                self._models[model_id] = restored
            return JSON_CONTENT_TYPE, _json(
                {"path": path, "model_id": model_id, "type": "load_weights"}
            )

        request_id = self._new_future("load_weights", make)
        return {"request_id": request_id, "model_id": model_id}

    def _save_weights_external(self, body: dict[str, Any]) -> dict[str, Any]:
        model = self._model(body.get("model_id"))
        name = body.get("path")
        if not name:
            raise _StandinError(400, "save_weights_external needs a name (path)")
        path = f"tinker://{model.model_id}/external_weights/{name}"
        files = _external_files(model)
        with self._lock:
            self.external[path] = files
        size = sum(len(data) for data in files.values())
        result = {"path": path, "size_bytes": size, "type": "save_weights_external"}
        request_id = self._new_future(
            "save_weights_external", lambda: (JSON_CONTENT_TYPE, _json(result))
        )
        return {"request_id": request_id, "model_id": model.model_id}

    def _external_weights_urls(self, path: str) -> dict[str, Any]:
        # /api/v1/training_runs/<run>/checkpoints/external_weights/<name>/external_weights_urls
        rest = path[len(API_PREFIX + "training_runs/") : -len("/external_weights_urls")]
        run, _, checkpoint = rest.partition("/checkpoints/")
        with self._lock:
            files = self.external.get(f"tinker://{run}/{checkpoint}")
        if files is None:
            raise _StandinError(404, f"no external weights {checkpoint} for {run}")
        urls = {}
        for name, data in files.items():
            token = f"dl{next(self._ids)}"
            with self._lock:
                self._downloads[token] = data
            urls[name] = f"{self.url}/downloads/{token}/{name}?signature=standin"
        return {"urls": urls, "expires": "2099-01-01T00:00:00Z"}

    def _create_sampling_session(self, body: dict[str, Any]) -> dict[str, Any]:
        model_path = body.get("model_path")
        base_model = body.get("base_model")
        if model_path:
            with self._lock:
                saved = self._checkpoints.get(str(model_path))
            if saved is None:
                raise _StandinError(400, f"no checkpoint at {model_path}")
            base_model = base_model or saved.base_model
        if not base_model:
            raise _StandinError(400, "create_sampling_session needs model_path or base_model")
        sampler_id = f"{body.get('session_id')}:sample:{body.get('sampling_session_seq_id')}"
        with self._lock:
            self._samplers[sampler_id] = (str(base_model), model_path)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def _asample(self, body: dict[str, Any]) -> dict[str, Any]:
        sampler_id = str(body.get("sampling_session_id"))
        with self._lock:
            known = sampler_id in self._samplers
        if not known:
            raise _StandinError(404, f"unknown sampling_session_id {sampler_id}")
        prompt = _prompt_tokens(body.get("prompt") or {})
        params = body.get("sampling_params") or {}
        num_samples = int(body.get("num_samples", 1))
        request_id = self._new_future(
            "asample",
            lambda: (
                PROTO_CONTENT_TYPE,
                self._sample_response(prompt, num_samples, params, body).SerializeToString(),
            ),
        )
        return {
            "request_id": request_id,
            "sample_sequence_ids": [f"{request_id}:{i}" for i in range(num_samples)],
        }

    def _sample_response(
        self,
        prompt: list[int],
        num_samples: int,
        params: Mapping[str, Any],
        body: Mapping[str, Any],
    ) -> pb.SampleResponse:
        max_tokens = params.get("max_tokens") or DEFAULT_MAX_TOKENS
        stop = params.get("stop")
        # Token-id stops only: without a tokenizer, string stops cannot be matched.
        stop_ids = {int(s) for s in stop if isinstance(s, int)} if isinstance(stop, list) else set()
        response = pb.SampleResponse()
        for index in range(num_samples):
            tokens = [int(t) for t in self.sample_fn(prompt, index, params)]
            reason = pb.STOP_REASON_STOP if len(tokens) < max_tokens else pb.STOP_REASON_LENGTH
            for pos, tok in enumerate(tokens[:max_tokens]):
                if tok in stop_ids:
                    tokens, reason = tokens[: pos + 1], pb.STOP_REASON_STOP
                    break
            tokens = tokens[:max_tokens]
            seq = response.sequences.add()
            seq.stop_reason = reason
            seq.tokens = np.asarray(tokens, dtype=np.int32).tobytes()
            seq.logprobs = np.asarray([token_logprob(t) for t in tokens], np.float32).tobytes()
        if body.get("prompt_logprobs"):
            # Position 0 has no context; NaN is how the wire says "no logprob".
            values = [math.nan] + [token_logprob(t) for t in prompt[1:]]
            response.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
        return response


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's httpx pools expect
    timeout = 30  # an idle keep-alive connection's thread ends after this
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stalls

    def do_POST(self) -> None:
        self.server.standin._handle(self, "POST")  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        self.server.standin._handle(self, "GET")  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read the records, not stderr


# ---- wire decoding and encoding -----------------------------------------------------------


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _endpoint_name(path: str) -> str:
    name = path[len(API_PREFIX) :] if path.startswith(API_PREFIX) else path.lstrip("/")
    if name.startswith("sessions/") and name.endswith("/finish"):
        return "finish_session"
    if name.startswith("samplers/"):
        return "get_sampler"
    if name.startswith("training_runs/") and name.endswith("/external_weights_urls"):
        return "external_weights_urls"
    if path.startswith("/downloads/"):
        return "download"
    return name


def _external_files(model: _Model) -> dict[str, bytes]:
    """What save_weights_external writes for `model`: a PEFT adapter folder in HF format
    (its tensors made up, seeded by the model id, so two saves of one model agree)."""
    from safetensors.numpy import save

    rng = np.random.default_rng(sum(model.model_id.encode()))
    tensors = {
        "base_model.model.layers.0.self_attn.q_proj.lora_A.weight": rng.standard_normal(
            (model.rank, 64), dtype=np.float32
        ),
        "base_model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros(
            (64, model.rank), dtype=np.float32
        ),
    }
    config = {
        "base_model_name_or_path": model.base_model,
        "peft_type": "LORA",
        "r": model.rank,
        "target_modules": ["q_proj"],
    }
    return {
        "adapter_config.json": _json(config),
        "adapter_model.safetensors": save(tensors),
    }


def _prompt_tokens(model_input: Mapping[str, Any]) -> list[int]:
    tokens: list[int] = []
    for chunk in model_input.get("chunks", []):
        tokens.extend(int(t) for t in chunk.get("tokens", []))
    return tokens


def _decode_tensor(tensor: pb.Tensor) -> dict[str, Any]:
    dtype, np_dtype = _PROTO_DTYPES.get(tensor.dtype, ("unknown", np.uint8))
    shape = list(tensor.shape)
    if tensor.HasField("sparse_csr"):
        csr = tensor.sparse_csr
        return {
            "dtype": dtype,
            "shape": shape,
            "sparse": True,
            "values": np.frombuffer(csr.values, dtype=np_dtype).tolist(),
            "crow_indices": np.frombuffer(csr.crow_indices, dtype=np.int64).tolist(),
            "col_indices": np.frombuffer(csr.col_indices, dtype=np.int64).tolist(),
        }
    array = np.frombuffer(tensor.dense, dtype=np_dtype)
    if not shape:
        shape = [int(array.size)]
    return {"dtype": dtype, "shape": shape, "values": array.reshape(shape).tolist()}


def _decode_forward_backward(msg: pb.ForwardBackwardRequest) -> dict[str, Any]:
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():  # v2 wins, as on the hosted service
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = []
    for datum in msg.data:
        tokens: list[int] = []
        other_chunks = 0
        for chunk in datum.model_input:
            if chunk.WhichOneof("chunk") == "encoded_text":
                tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
            else:
                other_chunks += 1
        entry: dict[str, Any] = {
            "model_input": tokens,
            "loss_fn_inputs": {k: _decode_tensor(v) for k, v in datum.loss_fn_inputs.items()},
        }
        if other_chunks:
            entry["other_chunks"] = other_chunks
        data.append(entry)
    return {
        "model_id": msg.model_id,
        "seq_id": msg.seq_id,
        "loss_fn": msg.loss_fn,
        "loss_fn_config": config,
        "forward_only": msg.forward_only,
        "data": data,
    }


def _check_inputs(loss_fn: str, datum: Mapping[str, Any]) -> None:
    inputs = datum["loss_fn_inputs"]
    if loss_fn in LOSS_INPUT_KEYS:
        required, optional = LOSS_INPUT_KEYS[loss_fn]
        unknown = sorted(set(inputs) - required - optional)
        missing = sorted(required - set(inputs))
        if unknown or missing:
            raise _UserError(
                f"loss_fn_inputs for {loss_fn!r}: unknown keys {unknown}, missing keys "
                f"{missing}; expected exactly {sorted(required)}"
            )
    elif loss_fn not in OPAQUE_LOSSES:
        raise _UserError(f"unknown loss_fn {loss_fn!r}")
    n = len(datum["model_input"])
    for key, tensor in inputs.items():
        if not tensor["shape"] or tensor["shape"][0] != n:
            raise _UserError(
                f"loss_fn_inputs[{key!r}] has shape {tensor['shape']}, but model_input has "
                f"{n} tokens"
            )


def _target_logprobs(datum: Mapping[str, Any]) -> np.ndarray:
    targets = datum["loss_fn_inputs"].get("target_tokens")
    tokens = np.asarray(targets["values"]) if targets else np.asarray(datum["model_input"])
    if tokens.ndim > 1:  # several targets per position: score the first
        tokens = tokens[:, 0]
    return np.asarray([token_logprob(int(t)) for t in tokens], dtype=np.float32)


def _objective(
    loss_fn: str, config: Mapping[str, Any], lp: np.ndarray, inputs: Mapping[str, Any]
) -> np.ndarray:
    """Per-token objective of the hosted losses (loss = -sum); formulas in notes/tinker.md."""

    def get(key: str) -> np.ndarray:
        return np.asarray(inputs[key]["values"], dtype=np.float64)

    if loss_fn == "cross_entropy":
        return get("weights") * lp
    if loss_fn not in RL_LOSSES and loss_fn != "gspo":
        return np.zeros_like(lp)
    q, adv = get("logprobs"), get("advantages")
    ratio = np.exp(lp - q)
    if loss_fn == "importance_sampling":
        return ratio * adv
    if loss_fn in ("ppo", "gspo"):
        low = float(config.get("clip_low_threshold", 0.8))
        high = float(config.get("clip_high_threshold", 1.2))
        return np.minimum(ratio * adv, np.clip(ratio, low, high) * adv)
    if loss_fn == "cispo":
        low = float(config.get("clip_low_threshold", 0.0))
        high = float(config.get("clip_high_threshold", 4.0))
        return np.clip(ratio, low, high) * lp * adv
    beta = float(config.get("beta", 0.05))  # dro
    return lp * adv - 0.5 * beta * (lp - q) ** 2


def _forward_backward_output(body: Mapping[str, Any]) -> pb.ForwardBackwardOutput:
    loss_fn = str(body["loss_fn"])
    config = body.get("loss_fn_config") or {}
    per_datum: list[np.ndarray] = []
    loss = 0.0
    for datum in body["data"]:
        _check_inputs(loss_fn, datum)
        lp = _target_logprobs(datum)
        per_datum.append(lp)
        objective = _objective(loss_fn, config, lp.astype(np.float64), datum["loss_fn_inputs"])
        loss -= float(objective.sum())
    out = pb.ForwardBackwardOutput()
    out.loss_fn_output_type = "ArrayRecord"
    record = out.loss_fn_outputs.add()
    record.num_datums = len(per_datum)
    field_ = record.fields["logprobs"]
    field_.dtype = pb.DTYPE_FLOAT32
    field_.data = b"".join(a.tobytes() for a in per_datum)
    # Byte offsets of each datum's slice, N + 1 of them.
    field_.offsets = np.cumsum([0] + [a.nbytes for a in per_datum], dtype=np.int64).tobytes()
    out.metrics["loss:sum"] = loss
    return out


TinkerStandin.handler_class = _Handler
TinkerStandin.thread_name = "Tinker stand-in"
