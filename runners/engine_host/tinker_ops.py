"""One client's Tinker operations in the engine host: training clients and samplers of the local
engine, by the ids the client gave them (the server's Tinker sessions, a run's models). Each
request (core.tinker_wire) is dispatched by its type, checked and queued on the connection's
reading thread, then acknowledged (`Accepted`, so the server's POST can answer 400 for a body
that does not parse, or `Refused`); its `Done` follows from whichever thread finished the work:
the request's answer, or `Failed` with Tinker's category (`user` for what the caller can fix,
`server` for the rest). Whatever the client made goes when it goes (`release_everything`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError
from tinker import types

from core.checkpoint_check import CheckpointUnusable
from core.failures import RunFailure
from core.model_names import ModelNotAvailable
from core.tinker_wire import (
    Accepted,
    Answer,
    Cancelled,
    CancelSamples,
    CreateLoss,
    CreateModel,
    Done,
    Failed,
    ForwardBackward,
    HeldModel,
    Joined,
    JoinGroup,
    LoadModel,
    LoadState,
    LossReady,
    ModelReady,
    OpenSampler,
    OptimStep,
    Refused,
    Release,
    Released,
    Request,
    Sample,
    Sampled,
    SamplerReady,
    Saved,
    SaveExternal,
    SaveSampler,
    SaveState,
    Snapshot,
    StateLoaded,
    Stepped,
    Trained,
    model_of,
)
from runners.engine.futures import LocalFuture, resolved, task
from runners.engine.local import LocalServiceClient
from runners.engine.recorded_sequences import UnknownSequence
from runners.engine.sample.sampler import LocalSamplingClient
from runners.engine.train.group import GradientGroup
from runners.engine.train.training import LocalTrainingClient
from runners.engine_host import custom_loss, proto, rollout_text
from runners.models.loading import tokenizer_folder

log = logging.getLogger("engine-host.tinker")
Send = Callable[[BaseModel], None]
R = TypeVar("R")
# Failures the caller can fix (bad input, a missing checkpoint, a full memory budget): a
# failed future with category "user"; anything else is the worker's ("server").
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, CheckpointUnusable)


class Refusal(Exception):
    """A request that cannot even be queued: its acknowledgement says so with an HTTP status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class Work(Generic[R]):
    """A queued request: the local engine's future, and how its result becomes the answer."""

    future: Future[R]
    answer: Callable[[R], Answer]


class TinkerOps:
    def __init__(self, service: LocalServiceClient, send: Send) -> None:
        self._service = service
        self._send = send
        self._lock = threading.Lock()
        self._models: dict[str, LocalFuture[LocalTrainingClient]] = {}
        self._samplers: dict[str, LocalFuture[LocalSamplingClient]] = {}
        self._last_done: dict[str, float] = {}  # when each model's last request ended
        self._losses: dict[str, custom_loss.CustomLoss] = {}  # by loss id (session-prefixed)
        # Samples running now: what stops each at its next decode step, by request id, with
        # its cancel group.
        self._stops: dict[int, tuple[str | None, threading.Event]] = {}
        # Closing a client waits for the request it runs: never on the reading thread.
        self._closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-release")
        self._answering = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-answers")

    def handle(self, request: Request) -> None:
        try:
            work = self._queue(request)
        except Refusal as exc:
            self._send(Refused(id=request.id, status=exc.status, detail=exc.detail))
            return
        except proto.WireError as exc:
            self._send(Refused(id=request.id, status=400, detail=str(exc)))
            return
        except Exception as exc:  # a bug here must not take the worker down with it
            log.exception("request %s (%s) failed", request.id, request.op)
            detail = f"the engine host failed on {request.op}: {type(exc).__name__}"
            self._send(Refused(id=request.id, status=500, detail=detail))
            return
        self._send(Accepted(id=request.id))
        self._answer_when_done(request.id, work, model_of(request))

    def refuse_line(self, line: str, error: ValidationError) -> None:
        """A line that is not a request (an operation this worker does not know): refused by
        its id, so that the POST waiting for it answers at once."""
        try:
            request_id = json.loads(line).get("id")
        except (ValueError, AttributeError):
            request_id = None
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            request_id = None
        self._send(Refused(id=request_id, status=400, detail=f"request: {_message(error)}"))

    def counts(self) -> tuple[int, int]:
        """Training clients and samplers this client holds now."""
        with self._lock:
            return len(self._models), len(self._samplers)

    def bases(self) -> list[str]:
        """The base models of the training clients and samplers this client holds (ready)."""
        with self._lock:
            models, samplers = list(self._models.values()), list(self._samplers.values())
        names = {m.result().get_info().model_name for m in models if _ready(m)}
        names |= {s.result().get_base_model() for s in samplers if _ready(s)}
        return sorted(str(name) for name in names)

    def release_everything(self) -> None:
        """The client is gone: its models and samplers go (requests still queued on them
        never run, the one running finishes), and the sequences and losses of its sessions."""
        with self._lock:
            sessions = {session_of(i) for i in [*self._models, *self._samplers, *self._losses]}
            models, self._models = list(self._models.values()), {}
            samplers, self._samplers = list(self._samplers.values()), {}
            self._last_done.clear()
            self._losses.clear()
            stops, self._stops = list(self._stops.values()), {}
        for _, stop in stops:  # nobody is left to read them
            stop.set()
        for session in sessions:
            self._service.sequences.forget(f"{session}:")
        self._closer.submit(self._close_all, models, samplers)
        self._closer.shutdown(wait=False)
        self._answering.shutdown(wait=False)

    def _queue(self, request: Request) -> Work[Any]:
        match request:
            case CreateModel():
                return self._create_model(request)
            case LoadModel():
                return self._load_model(request)
            case LoadState():
                return self._load_state(request)
            case ForwardBackward():
                return self._forward_backward(request)
            case OptimStep():
                return self._optim_step(request)
            case SaveState():
                return self._save_state(request)
            case SaveSampler():
                return self._save_sampler(request)
            case SaveExternal():
                return self._save_external(request)
            case Snapshot():
                return self._snapshot(request)
            case OpenSampler():
                return self._open_sampler(request)
            case Sample():
                return self._sample(request)
            case CancelSamples():
                return self._cancel_samples(request)
            case CreateLoss():
                return self._create_loss(request)
            case JoinGroup():
                return self._join_group(request)
            case Release():
                return self._release(request)

    # Models ------------------------------------------------------------------------------

    def _create_model(self, request: CreateModel) -> Work[LocalTrainingClient]:
        lora = request.lora
        future = _guard(
            lambda: self._service.create_lora_training_client(
                request.base_model,
                rank=lora.rank,
                seed=lora.seed,
                train_mlp=lora.train_mlp,
                train_attn=lora.train_attn,
                train_unembed=lora.train_unembed,
            )
        )
        return self._new_model(request.model_id, request.base_model, request.checkpoint_dir, future)

    def _load_model(self, request: LoadModel) -> Work[LocalTrainingClient]:
        create = (
            self._service.create_training_client_from_state_with_optimizer
            if request.optimizer
            else self._service.create_training_client_from_state
        )
        future = _guard(lambda: create(request.folder, request.base_model))
        base = request.base_model or ""
        return self._new_model(request.model_id, base, request.checkpoint_dir, future)

    def _new_model(
        self,
        model_id: str,
        base_model: str,
        checkpoint_dir: str,
        future: LocalFuture[LocalTrainingClient],
    ) -> Work[LocalTrainingClient]:
        with self._lock:
            if model_id in self._models:
                raise Refusal(409, f"model_id: {model_id} exists")
            self._models[model_id] = future

        def described(client: LocalTrainingClient) -> ModelReady:
            client.checkpoint_dir = Path(checkpoint_dir)
            info = client.get_info()
            name = info.model_data.model_name or base_model
            return ModelReady(
                base_model=name,
                arch=info.model_data.arch,
                lora_rank=info.lora_rank,
                tokenizer_id=tokenizer_folder(name, self._service.models_dir),
                steps=client.steps,
            )

        return Work(future, described)

    def _load_state(self, request: LoadState) -> Work[Any]:
        client = self._model(request.model_id)
        load = client.load_state_with_optimizer if request.optimizer else client.load_state
        future = _guard(lambda: load(request.folder))
        return Work(future, lambda _: StateLoaded(steps=client.steps))

    def _forward_backward(self, request: ForwardBackward) -> Work[types.ForwardBackwardOutput]:
        body = proto.decode_forward_backward(request.body)
        if body.model_id != request.model_id:
            raise Refusal(400, "model_id: the body names another model than its envelope")
        client = self._model(body.model_id)
        run = client.forward if body.forward_only else client.forward_backward

        def submit() -> LocalFuture[types.ForwardBackwardOutput]:
            if body.loss_fn == "custom":
                loss = self._loss(body, session_of(body.model_id))
                batch_loss = custom_loss.per_batch(loss, body.data)
                return client.forward_backward_of(body.data, batch_loss, not body.forward_only)
            _check_own_sequences(body, session_of(body.model_id))
            return run(body.data, body.loss_fn, dict(body.loss_fn_config) or None)

        future = _guard(submit)

        def trained(output: types.ForwardBackwardOutput) -> Trained:
            records = (
                [] if body.forward_only else rollout_text.datums(client.get_tokenizer(), body.data)
            )
            return Trained(
                output=proto.encode_forward_backward(output),
                tokens=body.tokens,
                loss=output.metrics.get("loss:sum"),
                forward_only=body.forward_only,
                records=records,
            )

        return Work(future, trained)

    def _optim_step(self, request: OptimStep) -> Work[types.OptimStepResponse]:
        client = self._model(request.model_id)
        future = _guard(lambda: client.optim_step(_optimizer_params(request.params)))
        return Work(future, lambda response: Stepped(metrics=response.metrics or {}))

    def _join_group(self, request: JoinGroup) -> Work[None]:
        client = self._model(request.model_id)

        def join() -> None:
            store = Path(request.store)
            group = GradientGroup(
                store, request.rank, request.size, request.backend, request.timeout_s
            )
            client.join_group(group).result()

        # The rendezvous waits for the other ranks: on a thread of its own, not the reader's.
        future, work = task(join)
        threading.Thread(target=work, daemon=True, name=f"join {request.model_id}").start()
        return Work(future, lambda _: Joined(rank=request.rank, size=request.size))

    def _save_state(self, request: SaveState) -> Work[Any]:
        client = self._model(request.model_id)
        future = _guard(
            lambda: client.save_state(
                request.name,
                overwrite=request.overwrite,
                user_metadata=request.user_metadata,
                refuse_existing=True,
            )
        )
        return Work(future, lambda saved: Saved(folder=saved.path, steps=client.steps))

    def _save_sampler(self, request: SaveSampler) -> Work[Any]:
        client = self._model(request.model_id)
        future = _guard(
            lambda: client.save_weights_for_sampler(
                request.name, user_metadata=request.user_metadata
            )
        )
        return Work(future, lambda saved: Saved(folder=saved.path, steps=client.steps))

    def _save_external(self, request: SaveExternal) -> Work[Any]:
        client = self._model(request.model_id)
        folder = client.checkpoint_dir / request.name / "external"
        future = _guard(lambda: client.export_adapter(folder))
        return Work(future, lambda saved: Saved(folder=saved.path, steps=client.steps))

    def _create_loss(self, request: CreateLoss) -> Work[None]:
        done: LocalFuture[None] = LocalFuture()
        try:
            loss = custom_loss.build(request.name, request.inputs, request.graph)
        except (ValueError, KeyError, TypeError) as exc:
            done.set_exception(ValueError(str(exc)))
        else:
            with self._lock:
                self._losses[request.loss_id] = loss
            done.set_result(None)
        return Work(done, lambda _: LossReady())

    def _loss(self, body: proto.ForwardBackward, session_id: str) -> custom_loss.CustomLoss:
        loss_id = str(body.loss_fn_config.get("loss_id", ""))
        with self._lock:
            loss = self._losses.get(loss_id) if loss_id.startswith(f"{session_id}:") else None
        if loss is None:
            raise ValueError(
                f"loss_fn_config['loss_id']: {loss_id[:100]!r} is no custom loss of this session; "
                "create_custom_loss makes one (its LossHandle carries the id)"
            )
        return loss

    # Samplers ----------------------------------------------------------------------------

    def _snapshot(self, request: Snapshot) -> Work[LocalSamplingClient]:
        """A sampler over the model's weights as they are now: ready once the model's earlier
        requests ran."""
        client = self._model(request.model_id)
        future = _guard(client.save_weights_and_get_sampling_client)
        self._new_sampler(request.sampler_id, future)
        return Work(future, lambda sampler: SamplerReady(base_model=sampler.get_base_model()))

    def _open_sampler(self, request: OpenSampler) -> Work[LocalSamplingClient]:
        """A sampler over saved sampler weights or the bare base model; it loads in the
        background and samples asked of it meanwhile wait."""
        source = (
            {"model_path": request.folder} if request.folder else {"base_model": request.base_model}
        )
        future = _guard(lambda: self._service.create_sampling_client(**source))
        self._new_sampler(request.sampler_id, future)
        return Work(future, lambda sampler: SamplerReady(base_model=sampler.get_base_model()))

    def _sample(self, request: Sample) -> Work[types.SampleResponse]:
        with self._lock:
            sampler_future = self._samplers.get(request.sampler_id)
        if sampler_future is None:
            raise Refusal(404, f"sampling_session_id: no sampler {request.sampler_id}")
        result: LocalFuture[types.SampleResponse] = LocalFuture()
        # Set once it starts: its prompt, and the sampler's tokenizer (its rollouts' text).
        started: list[tuple[types.ModelInput, Any]] = []
        stop = threading.Event()
        deadline = None if request.deadline_s is None else time.monotonic() + request.deadline_s
        with self._lock:
            self._stops[request.id] = (request.cancel_group, stop)
        result.add_done_callback(lambda _: self._stopped(request.id))

        def start(ready: Future[LocalSamplingClient]) -> None:
            try:
                sampler = ready.result()
                prompt = _prompt(request.prompt)
                started.append((prompt, sampler.get_tokenizer()))
                submitted = _submit(sampler, request, prompt, deadline, stop)
            except BaseException as exc:
                result.set_exception(exc)
                return
            submitted.add_done_callback(lambda done: _relay(done, result))

        sampler_future.add_done_callback(start)  # a sampler already loaded starts at once

        def sampled(response: types.SampleResponse) -> Sampled:
            prompt, tokenizer = started[0]
            records = rollout_text.samples(tokenizer, prompt.to_ints(), response)
            return Sampled(
                output=proto.encode_sample(response),
                tokens=proto.sampled_tokens(response),
                records=records,
            )

        return Work(result, sampled)

    def _cancel_samples(self, request: CancelSamples) -> Work[int]:
        with self._lock:
            stops = [stop for group, stop in self._stops.values() if group == request.group]
        for stop in stops:
            stop.set()
        return Work(resolved(len(stops)), lambda count: Cancelled(samples=count))

    def _stopped(self, request_id: int) -> None:
        with self._lock:
            self._stops.pop(request_id, None)

    # Ending ------------------------------------------------------------------------------

    def _release(self, request: Release) -> Work[None]:
        """Drop models and samplers (a session ended): requests still queued on them never
        run, the one running finishes; the memory only they used is freed. The answer says
        what the worker holds after."""
        with self._lock:
            models = [self._models.pop(i) for i in request.models if i in self._models]
            samplers = [self._samplers.pop(i) for i in request.samplers if i in self._samplers]
            for model_id in request.models:
                self._last_done.pop(model_id, None)
        if request.session_id:
            self._service.sequences.forget(f"{request.session_id}:")
            with self._lock:
                for loss_id in [i for i in self._losses if i.startswith(f"{request.session_id}:")]:
                    del self._losses[loss_id]
        done = self._closer.submit(self._close_all, models, samplers)

        def released(_: None) -> Released:
            held = [
                HeldModel(model=n, size_bytes=b, users=u)
                for n, b, u in self._service.bases.loaded()
            ]
            return Released(held=held)

        return Work(done, released)

    def _close_all(
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
            raise Refusal(404, f"model_id: no model {model_id} in the engine host")
        if not future.done() or future.exception() is not None:
            raise Refusal(409, f"model_id: {model_id} is not ready (its creation failed or runs)")
        return future.result()

    def _new_sampler(self, sampler_id: str, future: LocalFuture[LocalSamplingClient]) -> None:
        with self._lock:
            if sampler_id in self._samplers:
                raise Refusal(409, f"sampling_session_id: {sampler_id} exists")
            self._samplers[sampler_id] = future

    def _answer_when_done(self, request_id: int, work: Work[Any], model_id: str | None) -> None:
        """Its answer once done, with how long it ran: a model's requests run one after
        another, so one starts when it was taken or its model's previous one ended."""
        taken = time.monotonic()

        def done(finished: Future[Any]) -> None:
            now = time.monotonic()
            with self._lock:
                started = max(taken, self._last_done.get(model_id, taken)) if model_id else taken
                if model_id:
                    self._last_done[model_id] = now
            # Encoding the answer (protobuf, rollouts' text) is not the engine's thread's work:
            # one thread does it, in the order requests finished (a step after its
            # forward_backward, as the session counts them).
            try:
                self._answering.submit(answer, finished, max(0.0, now - started))
            except RuntimeError:  # the client went while this ran: nobody to answer
                pass

        def answer(finished: Future[Any], run_s: float) -> None:
            answer: Answer
            try:
                answer = work.answer(finished.result())
            except USER_ERRORS as exc:
                answer = Failed(error=_message(exc), category="user", failure=_failure(exc))
            except Exception as exc:
                log.error("request %s failed", request_id, exc_info=exc)
                error = f"{type(exc).__name__}: {exc}"
                answer = Failed(error=error, category="server", failure=_failure(exc))
            self._send(Done(id=request_id, answer=answer, run_s=run_s))

        work.future.add_done_callback(done)


def session_of(model_id: str) -> str:
    """The session a model or sampler id belongs to (`r-3f9c2a1b:train:0`: `r-3f9c2a1b`)."""
    return model_id.split(":", 1)[0]


def _check_own_sequences(body: proto.ForwardBackward, session_id: str) -> None:
    """Recorded sequences are the session's: a datum may name only those its own samplers
    recorded (the server gives each an id that starts with its session's)."""
    for sequence_id in sorted(body.sequence_ids()):
        if not sequence_id.startswith(f"{session_id}:"):
            raise UnknownSequence(
                f"provenance: sequence {sequence_id[:120]!r} was not sampled in this session "
                f"({session_id}); recorded sequences belong to the session whose sampler drew "
                "them"
            )


def _guard(call: Callable[[], LocalFuture[Any]]) -> LocalFuture[Any]:
    """The call's future; what it raises at once (the local backend checks input when it is
    submitted) becomes that future's failure: a failed future, never a refused request."""
    try:
        return call()
    except Exception as exc:
        failed: LocalFuture[Any] = LocalFuture()
        failed.set_exception(exc)
        return failed


def _ready(future: Future[Any]) -> bool:
    return future.done() and future.exception() is None


def _relay(source: Future[Any], target: LocalFuture[Any]) -> None:
    error = source.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


def _failure(exc: BaseException) -> str | None:
    """The run failure's kind `exc` is, if it is one (a model gone, a checkpoint unusable)."""
    return exc.category if isinstance(exc, RunFailure) else None


def _message(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    if isinstance(exc, ModelNotAvailable | FileNotFoundError | FileExistsError):
        return str(exc).strip("'\"")
    return str(exc)


def _optimizer_params(params: dict[str, Any]) -> types.AdamParams:
    kind = params.get("type", "adam")
    if kind != "adam":
        raise ValueError(
            f"optimizer {kind!r} is not supported: the local engine implements AdamW only "
            "(types.AdamParams)"
        )
    return types.AdamParams.model_validate({k: v for k, v in params.items() if k != "type"})


def _submit(
    sampler: LocalSamplingClient,
    request: Sample,
    prompt: types.ModelInput,
    deadline: float | None,
    stop: threading.Event,
) -> LocalFuture[types.SampleResponse]:
    """The request's sample on its loaded sampler, every option the wire carries passed on."""
    params = types.SamplingParams.model_validate(request.sampling_params)
    return sampler.sample(
        prompt,
        request.num_samples,
        params,
        include_prompt_logprobs=bool(request.prompt_logprobs),
        topk_prompt_logprobs=request.topk_prompt_logprobs,
        topk_sample_logprobs=request.topk_sample_logprobs,
        target_prompt_logprobs=request.target_prompt_logprobs,
        prompt_alt_tokens_k=request.prompt_alt_tokens_k,
        prompt_logprobs_last_n=request.prompt_logprobs_last_n,
        sequence_ids=request.sequence_ids,
        record_stability_info=request.record_stability_info,
        client=session_of(request.sampler_id),  # turns are fair between sessions
        deadline=deadline,
        cancel=stop,
    )


def _prompt(model_input: dict[str, Any]) -> types.ModelInput:
    tokens: list[int] = []
    for i, chunk in enumerate(model_input.get("chunks", [])):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise ValueError(
                f"prompt.chunks[{i}] is a {chunk.get('type')} chunk: the local engine samples "
                "from text (encoded_text chunks) only"
            )
        tokens.extend(int(t) for t in chunk.get("tokens", []))
    return types.ModelInput.from_ints(tokens)
