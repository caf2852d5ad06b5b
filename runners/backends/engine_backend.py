"""The local backend through an engine host (the default for runs, issue 43): the tinker-shaped
surface (runners/backends/surface.py) over the host's socket, so that a run holds no copy of the
model and decodes in the host's shared batches. The host is the one placement chooses for the
run's base model (core/engine_placement.py), for the run's life. Requests are the Tinker API's
own (core.tinker_wire; bodies in the SDK's protobuf, encoded and decoded with the SDK's
converters), named under the run's id: what the run made goes when its connection does.

If the host goes (it died, or cut this run off), every waiting future fails with `EngineLost`,
and the runner resumes itself from its last checkpoint on a new host (runners/train/loop.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import (
    deserialize_forward_backward_output,
    deserialize_sample_response,
)

from core.checkpoint_check import CheckpointUnusable
from core.engine_client import EngineClient, EngineLost
from core.engine_placement import Placement, placing, placing_several
from core.model_names import ModelNotAvailable
from core.pending import PendingCalls
from core.settings import Settings
from core.tinker_wire import (
    Accepted,
    CancelSamples,
    CreateModel,
    Done,
    Failed,
    ForwardBackward,
    Joined,
    JoinGroup,
    LoadModel,
    LoraSpec,
    ModelReady,
    Op,
    OpenSampler,
    OptimStep,
    Refused,
    Release,
    Reply,
    Sample,
    Sampled,
    SamplerReady,
    Saved,
    SaveSampler,
    SaveState,
    Snapshot,
    Stepped,
    Trained,
)
from runners.backends.cancel import CancelEvent
from runners.engine.disk_full import DiskFull
from runners.engine.futures import LocalFuture


class _Calls:
    """The run's connection: requests out with their ids, each answer to its future."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self._waiting: PendingCalls[tuple[LocalFuture[Any], Callable[[Any], Any]]]
        self._waiting = PendingCalls()
        client.start(on_tinker=self._reply, on_end=self._end)

    @property
    def lost(self) -> str | None:
        """Why the connection to the host is gone, once it is."""
        return self._waiting.ended

    def call(self, request: Op[Any], then: Callable[[Any], Any]) -> LocalFuture[Any]:
        """Send `request`; its future gets `then(answer)`, or fails (a refusal, a failure,
        the host's going)."""
        future: LocalFuture[Any] = LocalFuture()
        request_id = self._waiting.add((future, then))
        if request_id is None:
            future.set_exception(EngineLost(str(self.lost)))  # ended: it says why
            return future
        if not self.client.send_tinker(request.model_copy(update={"id": request_id})):
            self._settle(request_id, error=EngineLost(self.client.why_gone()))
        return future

    def _reply(self, reply: Reply) -> None:
        match reply:
            case Refused(id=request_id, detail=detail) if request_id is not None:
                self._settle(request_id, error=ValueError(detail))
            case Done(id=request_id, answer=Failed(error=error, category=category) as failed):
                self._settle(request_id, error=_raised(error, category, failed.failure))
            case Done(id=request_id, answer=answer):
                self._settle(request_id, answer=answer)
            case Accepted():
                pass

    def _settle(self, request_id: int, answer: Any = None, error: Exception | None = None) -> None:
        waiting = self._waiting.pop(request_id)
        if waiting is None:
            return
        future, then = waiting
        if error is None:
            try:
                value = then(answer)
            except Exception as exc:  # an answer of the wrong kind is the host's bug
                future.set_exception(exc)
                return
            future.set_result(value)
        else:
            future.set_exception(error)

    def _end(self, why: str) -> None:
        for future, _ in self._waiting.end(why):
            if not future.done():
                future.set_exception(EngineLost(why))


# The run failures the host reports by kind, raised here as the run would raise them in-process
# (so it records the same failure_kind).
_FAILURES: dict[str, type[Exception]] = {
    kind.category: kind for kind in (ModelNotAvailable, CheckpointUnusable, DiskFull)
}


def _raised(error: str, category: str, failure: str | None) -> Exception:
    known = _FAILURES.get(failure or "")
    if known is not None:
        return known(error)
    return ValueError(error) if category == "user" else RuntimeError(error)


def _expect(kind: type[Any]) -> Callable[[Any], Any]:
    def check(answer: Any) -> Any:
        if not isinstance(answer, kind):
            raise RuntimeError(f"the engine host answered {type(answer).__name__}")
        return answer

    return check


class EngineService:
    """ServiceClient: training and sampling clients for one run (or the inference client), in
    the engine host placement chose for `base_model` (its base is claimed there at once), or
    at `placed` (chosen by `several`)."""

    def __init__(
        self,
        settings: Settings,
        run_id: str,
        checkpoint_dir: Path,
        base_model: str | None = None,
        role: Literal["run", "inference"] = "run",
        placed: Placement | None = None,
    ) -> None:
        self.run_id = run_id
        self.checkpoint_dir = Path(checkpoint_dir)
        self.models_dir = settings.models_dir
        if placed is None:
            with placing(settings, base_model) as placed:
                self._calls = self._connect(settings, role, base_model, placed)
        else:
            self._calls = self._connect(settings, role, base_model, placed)
        self.device = self._calls.client.welcome.device
        self.slot = placed.slot
        self.host = placed.slot.name
        self._names = itertools.count()

    @classmethod
    def several(
        cls, settings: Settings, run_id: str, checkpoint_dir: Path, base_model: str, count: int
    ) -> list[EngineService]:
        """One run's services on `count` different hosts (the first its home), placed together."""
        with placing_several(settings, base_model, count) as placements:
            return [
                cls(settings, run_id, checkpoint_dir, base_model, "run", placed)
                for placed in placements
            ]

    def _connect(
        self,
        settings: Settings,
        role: Literal["run", "inference"],
        base_model: str | None,
        placed: Placement,
    ) -> _Calls:
        name = f"run {self.run_id}" if role == "run" else self.run_id
        calls = _Calls(EngineClient(settings, name, role, placed.slot))
        if placed.claim and base_model is not None:
            calls.client.claim(base_model)
        return calls

    @property
    def host_pid(self) -> int:
        return self._calls.client.pid

    @property
    def lost(self) -> bool:
        """Whether its host went (what it made there went too)."""
        return self._calls.lost is not None

    def name(self, kind: str) -> str:
        """An id of this run's (`r-…:train:0`): the host releases them with the run."""
        return f"{self.run_id}:{kind}:{next(self._names)}"

    def call(self, request: Op[Any], then: Callable[[Any], Any]) -> LocalFuture[Any]:
        return self._calls.call(request, then)

    def create_lora_training_client(
        self, base_model: str, rank: int = 32, seed: int | None = None, **_: Any
    ) -> LocalFuture[EngineTraining]:
        model_id = self.name("train")
        request = CreateModel(
            model_id=model_id,
            base_model=base_model,
            lora=LoraSpec(rank=rank, seed=seed),
            checkpoint_dir=str(self.checkpoint_dir),
        )
        return self.call(request, lambda ready: self._training(model_id, ready))

    def create_training_client_from_state_with_optimizer(
        self, path: str, **_: Any
    ) -> LocalFuture[EngineTraining]:
        model_id = self.name("train")
        request = LoadModel(
            model_id=model_id,
            folder=path,
            optimizer=True,
            base_model=None,
            checkpoint_dir=str(self.checkpoint_dir),
        )
        return self.call(request, lambda ready: self._training(model_id, ready))

    def create_sampling_client(
        self, model_path: str | None = None, base_model: str | None = None, **_: Any
    ) -> LocalFuture[EngineSampling]:
        if model_path is None and base_model is None:
            raise ValueError("create_sampling_client needs model_path or base_model")
        sampler_id = self.name("sample")
        request = OpenSampler(sampler_id=sampler_id, folder=model_path, base_model=base_model)
        return self.call(request, lambda ready: self._sampling(sampler_id, ready))

    def close(self, *_: Any, **__: Any) -> None:
        """Leave the host: everything this run made there goes."""
        self._calls.client.close()

    def release_sampler(self, sampler_id: str) -> None:
        """A sampler this run no longer holds: the host frees it (no answer awaited)."""
        if self._calls.lost is None:
            self.call(Release(models=[], samplers=[sampler_id]), lambda answer: answer)

    def _sampling(self, sampler_id: str, ready: Any) -> EngineSampling:
        ready = _expect(SamplerReady)(ready)
        return EngineSampling(self, sampler_id, ready.base_model, tokenizer_of=None)

    def _training(self, model_id: str, ready: Any) -> EngineTraining:
        ready = _expect(ModelReady)(ready)
        return EngineTraining(self, model_id, ready)


class EngineTraining:
    """TrainingClient: one LoRA adapter of the run, trained in the host."""

    def __init__(self, service: EngineService, model_id: str, ready: ModelReady) -> None:
        self._service = service
        self.model_id = model_id
        self.base_model = ready.base_model
        self.lora_rank = ready.lora_rank
        self._tokenizer: Any = None
        self._seq = itertools.count(1)

    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: dict[str, float | str] | None = None,
    ) -> LocalFuture[types.ForwardBackwardOutput]:
        return self._forward(data, loss_fn, loss_fn_config, forward_only=False)

    def forward(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: dict[str, float | str] | None = None,
    ) -> LocalFuture[types.ForwardBackwardOutput]:
        return self._forward(data, loss_fn, loss_fn_config, forward_only=True)

    def optim_step(
        self, optim_params: types.AdamParams | None = None, **kwargs: Any
    ) -> LocalFuture[types.OptimStepResponse]:
        params = optim_params or kwargs.get("adam_params") or types.AdamParams()
        request = OptimStep(model_id=self.model_id, params={"type": "adam", **params.model_dump()})
        return self._service.call(
            request,
            lambda answer: types.OptimStepResponse(metrics=_expect(Stepped)(answer).metrics),
        )

    def join_group(
        self, store: str, rank: int, size: int, backend: Literal["gloo", "nccl"], timeout_s: float
    ) -> LocalFuture[Joined]:
        """This model becomes rank `rank` of its run's host group (group_training.py)."""
        request = JoinGroup(
            model_id=self.model_id,
            store=store,
            rank=rank,
            size=size,
            backend=backend,
            timeout_s=timeout_s,
        )
        return self._service.call(request, _expect(Joined))

    def save_state(self, name: str, **_: Any) -> LocalFuture[types.SaveWeightsResponse]:
        request = SaveState(model_id=self.model_id, name=name, overwrite=True)
        return self._service.call(
            request, lambda answer: types.SaveWeightsResponse(path=_expect(Saved)(answer).folder)
        )

    def save_weights_for_sampler(
        self, name: str, **_: Any
    ) -> LocalFuture[types.SaveWeightsForSamplerResponse]:
        request = SaveSampler(model_id=self.model_id, name=name)
        return self._service.call(
            request,
            lambda answer: types.SaveWeightsForSamplerResponse(path=_expect(Saved)(answer).folder),
        )

    def save_weights_and_get_sampling_client(
        self, name: str | None = None, record_stability_info: bool = False, **_: Any
    ) -> LocalFuture[EngineSampling]:
        sampler_id = self._service.name("sample")
        request = Snapshot(model_id=self.model_id, sampler_id=sampler_id)

        def ready(answer: Any) -> EngineSampling:
            _expect(SamplerReady)(answer)
            return EngineSampling(
                self._service,
                sampler_id,
                self.base_model,
                tokenizer_of=self.get_tokenizer,
                record=record_stability_info,
            )

        return self._service.call(request, ready)

    def create_base_sampling_client(self) -> EngineSampling:
        """The base model alone on the host's loaded weights (no second copy): the reference of
        a run's KL penalty; it opens at its first request."""
        sampler_id = self._service.name("sample")
        opened = self._service.call(
            OpenSampler(sampler_id=sampler_id, base_model=self.base_model), _expect(SamplerReady)
        )
        return EngineSampling(
            self._service, sampler_id, self.base_model, self.get_tokenizer, opened=opened
        )

    def get_tokenizer(self) -> Any:
        if self._tokenizer is None:
            from runners.models.loading import load_tokenizer

            # By the model's name, as the host loads it (tiny-random's is built in-process).
            self._tokenizer = load_tokenizer(self.base_model, self._service.models_dir)
        return self._tokenizer

    def _forward(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: dict[str, float | str] | None,
        forward_only: bool,
    ) -> LocalFuture[types.ForwardBackwardOutput]:
        message = forward_backward_request_to_proto(
            types.ForwardBackwardRequest(
                forward_backward_input=types.ForwardBackwardInput(
                    data=data,
                    loss_fn=loss_fn,  # type: ignore[arg-type]  # the host checks the name
                    loss_fn_config=loss_fn_config,
                ),
                model_id=self.model_id,
                seq_id=next(self._seq),
            )
        )
        message.forward_only = forward_only
        request = ForwardBackward(model_id=self.model_id, body=message.SerializeToString())
        return self._service.call(
            request,
            lambda answer: deserialize_forward_backward_output(_expect(Trained)(answer).output),
        )


class EngineSampling:
    """SamplingClient: a sampler of the run in the host (a snapshot, saved weights, the base)."""

    def __init__(
        self,
        service: EngineService,
        sampler_id: str,
        base_model: str,
        tokenizer_of: Callable[[], Any] | None,
        record: bool = False,
        opened: LocalFuture[Any] | None = None,
    ) -> None:
        self._service = service
        self.sampler_id = sampler_id
        self._base_model = base_model
        self._tokenizer_of = tokenizer_of
        self._record = record
        self._opened = opened  # a sampler still opening: its failure is its requests'
        self._sequences = itertools.count()
        self._groups = itertools.count()
        # Forgotten here, gone there: a run makes a sampler a step, the host must not keep them.
        weakref.finalize(self, service.release_sampler, sampler_id)

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        *,
        deadline: float | None = None,
        cancel: CancelEvent | None = None,
        **extra: Any,
    ) -> LocalFuture[types.SampleResponse]:
        """tinker's sample(), and the local engine's `deadline` (a time.monotonic() value) and
        `cancel` (set: the host stops the samples at their next decode step)."""
        if extra:
            raise ValueError(
                "the engine host's samplers take tinker's sample(), deadline and cancel only, "
                f"not {sorted(extra)}"
            )
        if self._opened is not None and self._opened.done() and self._opened.exception():
            raise self._opened.exception()  # type: ignore[misc]
        sequence_ids = [
            f"{self._service.run_id}:seq:{self.sampler_id}:{next(self._sequences)}"
            for _ in range(num_samples)
        ]
        group = None if cancel is None else f"{self.sampler_id}:cancel:{next(self._groups)}"
        request = Sample(
            sampler_id=self.sampler_id,
            sequence_ids=sequence_ids,
            record_stability_info=self._record,
            num_samples=num_samples,
            prompt=prompt.model_dump(mode="json"),
            sampling_params=sampling_params.model_dump(mode="json", exclude_none=True),
            prompt_logprobs=include_prompt_logprobs or None,
            deadline_s=None if deadline is None else max(0.0, deadline - time.monotonic()),
            cancel_group=group,
        )
        sampled = self._service.call(request, lambda answer: _sampled(answer, sequence_ids))
        if cancel is not None and group is not None:
            cancel.on_set(lambda: self._cancel(group, sampled))
        return sampled

    def _cancel(self, group: str, sampled: LocalFuture[Any]) -> None:
        if not sampled.done():
            self._service.call(CancelSamples(group=group), lambda answer: answer)

    def compute_logprobs(self, prompt: types.ModelInput) -> LocalFuture[list[float | None]]:
        """Logprobs of each prompt token given the ones before it (None for the first)."""
        future = self.sample(
            prompt, 1, types.SamplingParams(max_tokens=1), include_prompt_logprobs=True
        )
        out: LocalFuture[list[float | None]] = LocalFuture()

        def relay(done: Any) -> None:
            if done.exception() is not None:
                out.set_exception(done.exception())
                return
            logprobs = done.result().prompt_logprobs
            if logprobs is None:
                out.set_exception(RuntimeError("the host answered without prompt logprobs"))
            else:
                out.set_result(list(logprobs))

        future.add_done_callback(relay)
        return out

    def get_tokenizer(self) -> Any:
        if self._tokenizer_of is not None:
            return self._tokenizer_of()
        from runners.models.loading import load_tokenizer

        return load_tokenizer(self._base_model, self._service.models_dir)

    def get_base_model(self) -> str:
        return self._base_model


def _sampled(answer: Any, sequence_ids: list[str]) -> types.SampleResponse:
    """The host's sample; the protobuf has no sequence ids, so they are the ones this client
    gave (stable_reinforce's provenance names them)."""
    response = deserialize_sample_response(_expect(Sampled)(answer).output)
    sequences = [
        dataclasses.replace(sequence, sequence_id=sequence_id)
        for sequence, sequence_id in zip(response.sequences, sequence_ids, strict=True)
    ]
    return dataclasses.replace(response, sequences=sequences)
