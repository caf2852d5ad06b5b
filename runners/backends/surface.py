"""The backend surface the runner and the inference worker program against: the shape of the
tinker SDK 0.38's clients, which the real SDK and the local backend both satisfy."""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from typing import Any, Protocol, TypeVar

from tinker import types

T = TypeVar("T", covariant=True)


class Future(Protocol[T]):
    """tinker's APIFuture: `.result(timeout)` or `await`."""

    def result(self, timeout: float | None = None) -> T: ...

    def __await__(self) -> Generator[Any, None, T]: ...


class SamplingClient(Protocol):
    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
    ) -> Awaitable[types.SampleResponse]: ...

    def compute_logprobs(self, prompt: types.ModelInput) -> Awaitable[list[float | None]]: ...


class TrainingClient(Protocol):
    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: dict[str, float] | None = None,
    ) -> Future[types.ForwardBackwardOutput]: ...

    def optim_step(self, optim_params: types.AdamParams) -> Future[types.OptimStepResponse]: ...

    def save_state(self, name: str) -> Future[types.SaveWeightsResponse]: ...

    def save_weights_for_sampler(
        self, name: str
    ) -> Future[types.SaveWeightsForSamplerResponse]: ...

    def save_weights_and_get_sampling_client(
        self, record_stability_info: bool = False
    ) -> Future[SamplingClient]: ...


class ServiceClient(Protocol):
    def create_lora_training_client(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> Future[TrainingClient]: ...

    def create_training_client_from_state_with_optimizer(
        self, path: str
    ) -> Future[TrainingClient]: ...

    def create_sampling_client(
        self, model_path: str | None = None, base_model: str | None = None
    ) -> Future[SamplingClient]: ...
