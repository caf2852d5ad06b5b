"""What a run asks of its backend, counted as it goes (issue 36): the service client wrapped so
that every training and sampling client it makes counts the tokens it prefills, samples and
trains, whoever calls it (a step, an evaluation, the Atropos face, a logprob recomputation);
and the device's wall seconds and the process's CPU seconds between two charges."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from core.cost import TINKER_HOSTED, Spent

T = TypeVar("T")
U = TypeVar("U")


class CostMeter:
    """Counts from `wrap` on: the device is held from then (the model loads after it)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._lock = threading.Lock()  # sampling futures may resolve on other threads
        self._since: float | None = None
        self._cpu_since = 0.0
        self._prefill = self._sampled = self._trained = 0
        self.device: str | None = None

    def wrap(self, service: Any, backend: str) -> Any:
        """`service` (a tinker-shaped ServiceClient), counted."""
        local_device = getattr(service, "device", None)  # the local engine's torch device
        self.device = TINKER_HOSTED if backend == "tinker" else str(local_device or "cpu")
        self._since, self._cpu_since = self._clock(), self._cpu_clock()
        return _Service(service, self)

    def add(self, prefill: int = 0, sampled: int = 0, trained: int = 0) -> None:
        with self._lock:
            self._prefill += prefill
            self._sampled += sampled
            self._trained += trained

    def take(self) -> Spent | None:
        """What was spent since the last take; None before `wrap` (nothing was held)."""
        with self._lock:
            if self._since is None:
                return None
            now, cpu = self._clock(), self._cpu_clock()
            spent = Spent(
                device_s=now - self._since,
                cpu_s=cpu - self._cpu_since,
                tokens_prefill=self._prefill,
                tokens_sampled=self._sampled,
                tokens_trained=self._trained,
                device=self.device,
            )
            self._since, self._cpu_since = now, cpu
            self._prefill = self._sampled = self._trained = 0
        return spent


class _Mapped(Generic[T, U]):
    """A backend future whose value goes through `then` once (`.result()` or `await`); any
    other attribute is the inner future's."""

    def __init__(self, inner: Any, then: Callable[[T], U]) -> None:
        self._inner = inner
        self._then = then
        self._lock = threading.Lock()
        self._done = False
        self._value: U | None = None

    def _map(self, value: T) -> U:
        with self._lock:
            if not self._done:
                self._value, self._done = self._then(value), True
            return self._value  # type: ignore[return-value]

    def result(self, timeout: float | None = None) -> U:
        return self._map(self._inner.result(timeout))

    def __await__(self) -> Generator[Any, None, U]:
        return self._awaited().__await__()

    async def _awaited(self) -> U:
        return self._map(await self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Counted:
    """A client whose methods not counted here are the inner client's."""

    def __init__(self, inner: Any, meter: CostMeter) -> None:
        self._inner = inner
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Service(_Counted):
    def create_lora_training_client(self, *args: Any, **kwargs: Any) -> _Mapped[Any, Any]:
        return _Mapped(self._inner.create_lora_training_client(*args, **kwargs), self._training)

    def create_training_client_from_state_with_optimizer(
        self, *args: Any, **kwargs: Any
    ) -> _Mapped[Any, Any]:
        future = self._inner.create_training_client_from_state_with_optimizer(*args, **kwargs)
        return _Mapped(future, self._training)

    def create_sampling_client(self, *args: Any, **kwargs: Any) -> _Mapped[Any, Any]:
        return _Mapped(self._inner.create_sampling_client(*args, **kwargs), self._sampling)

    def _training(self, client: Any) -> _Training:
        return _Training(client, self._meter)

    def _sampling(self, client: Any) -> _Sampling:
        return _Sampling(client, self._meter)


class _Training(_Counted):
    def forward_backward(self, data: list[Any], *args: Any, **kwargs: Any) -> Any:
        # Every token of every datum goes through the forward and backward passes (what
        # hosted Tinker bills as train), not only the ones with an advantage.
        self._meter.add(trained=sum(datum.model_input.length for datum in data))
        return self._inner.forward_backward(data, *args, **kwargs)

    def save_weights_and_get_sampling_client(self, *args: Any, **kwargs: Any) -> Any:
        future = self._inner.save_weights_and_get_sampling_client(*args, **kwargs)
        return _Mapped(future, lambda client: _Sampling(client, self._meter))


class _Sampling(_Counted):
    def sample(self, prompt: Any, num_samples: int, *args: Any, **kwargs: Any) -> Any:
        # A request's prompt is prefilled once, however many samples it asks for.
        self._meter.add(prefill=prompt.length)
        future = self._inner.sample(prompt, num_samples, *args, **kwargs)
        return _Mapped(future, self._sampled)

    def compute_logprobs(self, prompt: Any, *args: Any, **kwargs: Any) -> Any:
        self._meter.add(prefill=prompt.length)
        return self._inner.compute_logprobs(prompt, *args, **kwargs)

    def _sampled(self, response: Any) -> Any:
        self._meter.add(sampled=sum(len(s.tokens) for s in response.sequences))
        return response
