"""Tinker backend: the real tinker SDK client for the runner, with every creation call bounded.

The SDK retries an unreachable service for about 5 minutes in the caller's thread, so client
creation runs in a daemon thread here and gives up after `timeout_s` with a clear error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, Literal, NoReturn, TypeVar

import tinker

from core.failures import RunFailure

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The SDK's own default (tinker.lib.base_url); passing it explicitly keeps the SDK from
# reading TINKER_BASE_URL behind the settings' back.
DEFAULT_BASE_URL = "https://tinker.thinkingmachines.dev/services/tinker-prod"
DEFAULT_TIMEOUT_S = 120.0
_KEY_PREFIXES = ("tml-", "eyJ")  # an API key, or a JWT credential


class TinkerUnavailable(RunFailure, RuntimeError):
    """The Tinker backend cannot be used: no key, a malformed or refused key, or no service."""

    category = "backend"


class TinkerUnreachable(TinkerUnavailable):
    """The Tinker service did not answer within the timeout."""


class TinkerCallError(RuntimeError):
    """A Tinker call reached the service and failed."""


def check_api_key(api_key: str | None) -> str:
    """The key, stripped, or TinkerUnavailable at once; the message never contains the key."""
    key = (api_key or "").strip()
    if not key:
        raise TinkerUnavailable(
            "The tinker backend needs an API key: set TINKER_API_KEY in the environment of "
            'the server that starts the run, or use backend "local".'
        )
    if not key.startswith(_KEY_PREFIXES):
        raise TinkerUnavailable(
            "TINKER_API_KEY is malformed: a Tinker API key starts with 'tml-' (or is a JWT "
            "starting with 'eyJ'). Fix the value, or use backend \"local\"."
        )
    return key


class BoundedFuture(Generic[T]):
    """An SDK call running in a daemon thread; `.result()` and `await` give up at the deadline.

    A daemon thread, not an executor: a call stuck in the SDK's retries must not keep the
    process alive at exit.
    """

    def __init__(
        self,
        call: Callable[[], T],
        *,
        what: str,
        base_url: str,
        timeout_s: float,
        redact: Callable[[str], str],
    ) -> None:
        self._what = what
        self._base_url = base_url
        self._timeout_s = timeout_s
        self._redact = redact
        self._deadline = time.monotonic() + timeout_s
        self._future: concurrent.futures.Future[T] = concurrent.futures.Future()
        threading.Thread(target=self._run, args=(call,), name="tinker-call", daemon=True).start()

    def _run(self, call: Callable[[], T]) -> None:
        if not self._future.set_running_or_notify_cancel():
            return
        try:
            self._future.set_result(call())
        except BaseException as e:  # handed to the waiter, which translates it
            self._future.set_exception(e)

    def _wait_s(self, timeout: float | None) -> float:
        if timeout is not None:
            return timeout
        return max(0.0, self._deadline - time.monotonic())

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> T:
        """The client; `timeout` defaults to what is left of the service's `timeout_s`."""
        try:
            return self._future.result(self._wait_s(timeout))
        except Exception as e:
            self._reraise(e)

    async def result_async(self, timeout: float | None = None) -> T:
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self._future), self._wait_s(timeout))
        except Exception as e:
            self._reraise(e)

    def __await__(self) -> Generator[Any, None, T]:
        return self.result_async().__await__()

    def future(self) -> concurrent.futures.Future[T]:
        """The underlying future, unbounded (for concurrent.futures.wait and the like)."""
        return self._future

    def coroutine(self) -> Coroutine[Any, Any, T]:
        return self.result_async()

    def _reraise(self, error: Exception) -> NoReturn:
        translated = self._translate(error)
        if translated is error:
            raise error
        # A timeout's own traceback only shows our wait; other errors keep their cause.
        raise translated from (None if isinstance(error, TimeoutError) else error)

    def _translate(self, error: Exception) -> Exception:
        if isinstance(error, TinkerUnavailable | TinkerCallError):
            return error
        if isinstance(error, TimeoutError):
            return TinkerUnreachable(
                f"Tinker unreachable at {self._base_url}: {self._what} got no answer within "
                f"{self._timeout_s:g} s (check the URL and the network, or use backend "
                '"local").'
            )
        if isinstance(error, tinker.AuthenticationError | tinker.PermissionDeniedError):
            return TinkerUnavailable(
                f"Tinker at {self._base_url} refused the API key (HTTP {error.status_code}) "
                f'while {self._what}; check TINKER_API_KEY, or use backend "local".'
            )
        detail = self._redact(f"{type(error).__name__}: {error}")
        return TinkerCallError(f"Tinker {self._what} failed at {self._base_url}: {detail}")


class TinkerService:
    """The runner's view of the hosted service: the SDK's ServiceClient with bounded creation.

    The training and sampling clients it hands out are the SDK's own (forward_backward,
    optim_step, save_state, save_weights_for_sampler, sample, ...); wait on their futures
    with `.result(timeout=...)`.
    """

    backend = "tinker"

    def __init__(self, api_key: str, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._secret = api_key
        self._client = tinker.ServiceClient(base_url=base_url, api_key=api_key)
        # Set once the SDK has a session; before that a creation thread may hold the SDK's
        # lifecycle lock while it retries, and close() must not wait on it.
        self._connected = threading.Event()
        self._closed = False

    def __repr__(self) -> str:
        return f"TinkerService(base_url={self.base_url!r}, timeout_s={self.timeout_s:g})"

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def _bounded(self, what: str, submit: Callable[[], Any]) -> BoundedFuture[Any]:
        if self._closed:
            raise TinkerCallError("this TinkerService is closed")

        def call() -> Any:
            sdk_future = submit()  # the first call blocks here while the SDK opens a session
            self._connected.set()
            return sdk_future.result(timeout=self.timeout_s)

        return BoundedFuture(
            call,
            what=what,
            base_url=self.base_url,
            timeout_s=self.timeout_s,
            redact=self._redact,
        )

    def create_lora_training_client(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> BoundedFuture[tinker.TrainingClient]:
        return self._bounded(
            f"creating a LoRA training client for {base_model}",
            lambda: self._client.create_lora_training_client(base_model, rank=rank, seed=seed),
        )

    def create_training_client_from_state(self, path: str) -> BoundedFuture[tinker.TrainingClient]:
        return self._bounded(
            f"loading weights from {path}",
            lambda: self._client.create_training_client_from_state(path),
        )

    def create_training_client_from_state_with_optimizer(
        self, path: str
    ) -> BoundedFuture[tinker.TrainingClient]:
        return self._bounded(
            f"loading weights and optimizer state from {path}",
            lambda: self._client.create_training_client_from_state_with_optimizer(path),
        )

    def create_sampling_client(
        self, model_path: str | None = None, base_model: str | None = None
    ) -> BoundedFuture[tinker.SamplingClient]:
        if model_path is None and base_model is None:
            raise ValueError("create_sampling_client needs model_path or base_model")
        return self._bounded(
            f"creating a sampling client for {model_path or base_model}",
            lambda: self._client.create_sampling_client(
                model_path=model_path, base_model=base_model
            ),
        )

    def close(self, status: Literal["success", "errored", "interrupted"] = "success") -> None:
        """Finish the session, waiting at most `timeout_s`; best effort, never raises."""
        if self._closed:
            return
        self._closed = True
        if not self._connected.is_set():
            return  # no session was opened, so there is nothing to finish
        try:
            self._client.close(status).result(timeout=self.timeout_s)
        except Exception as e:  # the service ends an abandoned session by itself
            logger.warning("closing the Tinker session failed: %s", self._redact(str(e)))

    def __enter__(self) -> TinkerService:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self.close("success" if exc_type is None else "errored")


def create_tinker_service(
    api_key: str | None, base_url: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> TinkerService:
    """A TinkerService, or TinkerUnavailable at once when the key is missing or malformed.

    Values come from the caller (the runner's settings); nothing here reads the environment.
    """
    key = check_api_key(api_key)
    url = (base_url or DEFAULT_BASE_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise TinkerUnavailable(
            f"Tinker base URL {url!r} is not an http(s) URL; fix the setting, or leave it "
            "empty for the hosted service."
        )
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    logger.info("Tinker backend at %s (timeout %g s)", url, timeout_s)
    return TinkerService(key, url, timeout_s)
