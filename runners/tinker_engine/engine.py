"""The Tinker engine's work: training clients and samplers of the local backend, by the ids
the server gave them, each request acknowledged once it is checked and queued, and answered
when done.

Every request is a dict with an `id` and an `op`. The acknowledgement (`ack`) comes first,
on the reading thread, so the server's POST can answer 400 for a body that does not parse;
the answer (`done`) follows from whichever thread finished the work: JSON (`json`), or
protobuf bytes in base64 (`proto`), or an error with Tinker's category (`user` for what the
caller can fix, `server` for the rest), with `stats` the server records on the run.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tinker import types

from core.checkpoint_check import CheckpointUnusable
from core.model_names import ModelNotAvailable
from runners.engine.futures import LocalFuture
from runners.engine.local import LocalServiceClient
from runners.engine.sampler import LocalSamplingClient
from runners.engine.training import LocalTrainingClient
from runners.models.loading import tokenizer_folder
from runners.tinker_engine import wire

log = logging.getLogger("tinker-engine")
Message = dict[str, Any]
Send = Callable[[Message], None]
# Failures the caller can fix (bad input, a missing checkpoint, a full memory budget): a
# failed future with category "user"; anything else is the engine's ("server").
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, CheckpointUnusable)


class Refused(Exception):
    """A request that cannot even be queued: its acknowledgement says so with an HTTP status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class TinkerEngine:
    def __init__(self, service: LocalServiceClient, send: Send) -> None:
        self._service = service
        self._send = send
        self._lock = threading.Lock()
        self._models: dict[str, LocalFuture[LocalTrainingClient]] = {}
        self._samplers: dict[str, LocalFuture[LocalSamplingClient]] = {}
        # Closing a client waits for the request it runs: never on the reading thread.
        self._closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-release")

    def handle(self, message: Message) -> None:
        request_id = message.get("id")
        try:
            op = getattr(self, f"_op_{message['op']}", None)
            if op is None:
                raise Refused(400, f"op: unknown operation {message['op']!r}")
            op(request_id, message)
        except Refused as exc:
            self._send({"id": request_id, "ack": False, "status": exc.status, "detail": exc.detail})
        except wire.WireError as exc:
            self._send({"id": request_id, "ack": False, "status": 400, "detail": str(exc)})
        except Exception as exc:  # a bug here must not take the engine down with it
            log.exception("request %s (%s) failed", request_id, message.get("op"))
            detail = f"the Tinker engine failed on {message.get('op')}: {type(exc).__name__}"
            self._send({"id": request_id, "ack": False, "status": 500, "detail": detail})

    def close(self) -> None:
        self._closer.shutdown(wait=False, cancel_futures=True)
        self._service.close()

    # Models ------------------------------------------------------------------------------

    def _op_create_model(self, request_id: int, m: Message) -> None:
        lora = m["lora"]
        future = _guard(
            lambda: self._service.create_lora_training_client(
                m["base_model"],
                rank=lora["rank"],
                seed=lora.get("seed"),
                train_mlp=lora.get("train_mlp", True),
                train_attn=lora.get("train_attn", True),
                train_unembed=lora.get("train_unembed", True),
            )
        )
        self._new_model(request_id, m, future)

    def _op_load_model(self, request_id: int, m: Message) -> None:
        """A new model whose first request loads a state checkpoint (create_training_client_
        from_state[_with_optimizer])."""
        create = (
            self._service.create_training_client_from_state_with_optimizer
            if m["optimizer"]
            else self._service.create_training_client_from_state
        )
        future = _guard(lambda: create(m["folder"], m.get("base_model")))
        self._new_model(request_id, m, future)

    def _new_model(
        self, request_id: int, m: Message, future: LocalFuture[LocalTrainingClient]
    ) -> None:
        model_id, folder = m["model_id"], Path(m["checkpoint_dir"])
        with self._lock:
            if model_id in self._models:
                raise Refused(409, f"model_id: {model_id} exists")
            self._models[model_id] = future
        self._ack(request_id)

        def described(client: LocalTrainingClient) -> Message:
            client.checkpoint_dir = folder
            info = client.get_info()
            name = info.model_data.model_name or m.get("base_model") or ""
            return {
                "json": {
                    "base_model": name,
                    "arch": info.model_data.arch,
                    "lora_rank": info.lora_rank,
                    "tokenizer_id": tokenizer_folder(name, self._service.models_dir),
                    "steps": client.steps,
                }
            }

        self._answer(request_id, future, described)

    def _op_load_state(self, request_id: int, m: Message) -> None:
        client = self._model(m["model_id"])
        load = client.load_state_with_optimizer if m["optimizer"] else client.load_state
        future = _guard(lambda: load(m["folder"]))
        self._ack(request_id)
        self._answer(request_id, future, lambda _: {"json": {"steps": client.steps}})

    def _op_forward_backward(self, request_id: int, m: Message) -> None:
        request = wire.decode_forward_backward(base64.b64decode(m["body"]))
        if request.model_id != m["model_id"]:
            raise Refused(400, "model_id: the body names another model than its envelope")
        client = self._model(request.model_id)
        run = client.forward if request.forward_only else client.forward_backward
        future = _guard(
            lambda: run(request.data, request.loss_fn, dict(request.loss_fn_config) or None)
        )
        self._ack(request_id)

        def encoded(output: types.ForwardBackwardOutput) -> Message:
            stats = {
                "tokens": request.tokens,
                "loss": output.metrics.get("loss:sum"),
                "forward_only": request.forward_only,
            }
            return {"proto": _b64(wire.encode_forward_backward(output)), "stats": stats}

        self._answer(request_id, future, encoded)

    def _op_optim_step(self, request_id: int, m: Message) -> None:
        client = self._model(m["model_id"])
        future = _guard(lambda: client.optim_step(_optimizer_params(m["params"])))
        self._ack(request_id)

        def answered(response: types.OptimStepResponse) -> Message:
            metrics = response.metrics or {}
            return {"json": {"metrics": metrics}, "stats": metrics}

        self._answer(request_id, future, answered)

    def _op_save_state(self, request_id: int, m: Message) -> None:
        client = self._model(m["model_id"])
        future = _guard(
            lambda: client.save_state(
                m["name"],
                overwrite=bool(m.get("overwrite")),
                user_metadata=m.get("user_metadata"),
                refuse_existing=True,
            )
        )
        self._ack(request_id)
        self._answer(request_id, future, lambda saved: _saved(saved.path, client))

    def _op_save_sampler(self, request_id: int, m: Message) -> None:
        client = self._model(m["model_id"])
        future = _guard(
            lambda: client.save_weights_for_sampler(m["name"], user_metadata=m.get("user_metadata"))
        )
        self._ack(request_id)
        self._answer(request_id, future, lambda saved: _saved(saved.path, client))

    # Samplers ----------------------------------------------------------------------------

    def _op_snapshot(self, request_id: int, m: Message) -> None:
        """A sampler over the model's weights as they are now (save_weights_and_get_sampling_
        client): ready once the model's earlier requests ran."""
        client = self._model(m["model_id"])
        future = _guard(client.save_weights_and_get_sampling_client)
        self._new_sampler(m["sampler_id"], future)
        self._ack(request_id)
        self._answer(request_id, future, lambda _: {"json": {}})

    def _op_open_sampler(self, request_id: int, m: Message) -> None:
        """A sampler over saved sampler weights (`folder`) or the bare base model; it loads in
        the background and samples asked of it meanwhile wait."""
        source = {"model_path": m["folder"]} if m.get("folder") else {"base_model": m["base_model"]}
        future = _guard(lambda: self._service.create_sampling_client(**source))
        self._new_sampler(m["sampler_id"], future)
        self._ack(request_id)

    def _op_sample(self, request_id: int, m: Message) -> None:
        with self._lock:
            sampler_future = self._samplers.get(m["sampler_id"])
        if sampler_future is None:
            raise Refused(404, f"sampling_session_id: no sampler {m['sampler_id']}")
        request = m["request"]
        self._ack(request_id)
        result: LocalFuture[types.SampleResponse] = LocalFuture()

        def start(ready: Future[LocalSamplingClient]) -> None:
            try:
                sampler = ready.result()
                params = types.SamplingParams.model_validate(request.get("sampling_params") or {})
                submitted = sampler.sample(
                    _prompt(request.get("prompt") or {}),
                    int(request.get("num_samples", 1)),
                    params,
                    include_prompt_logprobs=bool(request.get("prompt_logprobs")),
                    topk_prompt_logprobs=int(request.get("topk_prompt_logprobs") or 0),
                    topk_sample_logprobs=int(request.get("topk_sample_logprobs") or 0),
                    target_prompt_logprobs=request.get("target_prompt_logprobs"),
                    prompt_alt_tokens_k=int(request.get("prompt_alt_tokens_k") or 0),
                    prompt_logprobs_last_n=request.get("prompt_logprobs_last_n"),
                )
            except BaseException as exc:
                result.set_exception(exc)
                return
            submitted.add_done_callback(lambda done: _relay(done, result))

        sampler_future.add_done_callback(start)

        def encoded(response: types.SampleResponse) -> Message:
            stats = {"tokens": wire.sampled_tokens(response)}
            return {"proto": _b64(wire.encode_sample(response)), "stats": stats}

        self._answer(request_id, result, encoded)

    # Ending ------------------------------------------------------------------------------

    def _op_release(self, request_id: int, m: Message) -> None:
        """Drop models and samplers (a session ended): requests still queued on them never
        run, the one running finishes; the memory only they used is freed. The answer says
        what the engine holds after."""
        with self._lock:
            models = [self._models.pop(i) for i in m.get("models", []) if i in self._models]
            samplers = [self._samplers.pop(i) for i in m.get("samplers", []) if i in self._samplers]
        self._ack(request_id)
        done = self._closer.submit(self._release, models, samplers)

        def loaded(_: None) -> Message:
            held = [
                {"model": n, "bytes": b, "users": u} for n, b, u in self._service.bases.loaded()
            ]
            return {"json": {"loaded": held}}

        self._answer(request_id, done, loaded)

    def _release(
        self,
        models: list[LocalFuture[LocalTrainingClient]],
        samplers: list[LocalFuture[LocalSamplingClient]],
    ) -> None:
        for sampler in samplers:
            if sampler.exception() is None:  # waits for one still loading
                sampler.result().close()
        for model in models:
            if model.exception() is None:
                self._service.forget(model.result(), cancel_pending=True)

    # Helpers -----------------------------------------------------------------------------

    def _model(self, model_id: str) -> LocalTrainingClient:
        with self._lock:
            future = self._models.get(model_id)
        if future is None:
            raise Refused(404, f"model_id: no model {model_id} in the engine")
        if not future.done() or future.exception() is not None:
            raise Refused(409, f"model_id: {model_id} is not ready (its creation failed or runs)")
        return future.result()

    def _new_sampler(self, sampler_id: str, future: LocalFuture[LocalSamplingClient]) -> None:
        with self._lock:
            if sampler_id in self._samplers:
                raise Refused(409, f"sampling_session_id: {sampler_id} exists")
            self._samplers[sampler_id] = future

    def _ack(self, request_id: int) -> None:
        self._send({"id": request_id, "ack": True})

    def _answer(
        self, request_id: int, future: Future[Any], encode: Callable[[Any], Message]
    ) -> None:
        def done(finished: Future[Any]) -> None:
            try:
                message = encode(finished.result())
            except USER_ERRORS as exc:
                message = {"error": _message(exc), "category": "user"}
            except Exception as exc:
                log.error("request %s failed", request_id, exc_info=exc)
                message = {"error": f"{type(exc).__name__}: {exc}", "category": "server"}
            self._send({"id": request_id, "done": True, **message})

        future.add_done_callback(done)


def _guard(call: Callable[[], LocalFuture[Any]]) -> LocalFuture[Any]:
    """The call's future; what it raises at once (the local backend checks input when it is
    submitted) becomes that future's failure: a failed future, never a refused request."""
    try:
        return call()
    except Exception as exc:
        failed: LocalFuture[Any] = LocalFuture()
        failed.set_exception(exc)
        return failed


def _relay(source: Future[Any], target: LocalFuture[Any]) -> None:
    error = source.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


def _message(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    if isinstance(exc, ModelNotAvailable | FileNotFoundError | FileExistsError):
        return str(exc).strip("'\"")
    return str(exc)


def _optimizer_params(params: Message) -> types.AdamParams:
    kind = params.get("type", "adam")
    if kind != "adam":
        raise ValueError(
            f"optimizer {kind!r} is not supported: the local engine implements AdamW only "
            "(types.AdamParams)"
        )
    return types.AdamParams.model_validate({k: v for k, v in params.items() if k != "type"})


def _prompt(model_input: Message) -> types.ModelInput:
    tokens: list[int] = []
    for i, chunk in enumerate(model_input.get("chunks", [])):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise ValueError(
                f"prompt.chunks[{i}] is a {chunk.get('type')} chunk: the local engine samples "
                "from text (encoded_text chunks) only"
            )
        tokens.extend(int(t) for t in chunk.get("tokens", []))
    return types.ModelInput.from_ints(tokens)


def _saved(folder: str, client: LocalTrainingClient) -> Message:
    return {"json": {"folder": folder, "steps": client.steps}}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
