"""The future type the local backend returns: `.result()`, `await fut` and `result_async()`.

It mirrors tinker's APIFuture so one training loop can drive either backend.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


class LocalFuture(concurrent.futures.Future[T]):
    """A concurrent future that can also be awaited from inside a running event loop."""

    def result(self, timeout: float | None = None) -> T:
        return super().result(timeout)

    async def result_async(self, timeout: float | None = None) -> T:
        # shield: cancelling the awaiting task must not cancel queued work on the client,
        # whose later requests may depend on it (requests run strictly in order).
        waiter = asyncio.shield(asyncio.wrap_future(self))
        return await asyncio.wait_for(waiter, timeout)

    def __await__(self) -> Generator[Any, None, T]:
        return self.result_async().__await__()

    def future(self) -> concurrent.futures.Future[T]:
        return self

    def coroutine(self) -> Coroutine[Any, Any, T]:
        return self.result_async()


def resolved(value: T) -> LocalFuture[T]:
    """A future that is already done (for calls with nothing to wait on)."""
    fut: LocalFuture[T] = LocalFuture()
    fut.set_result(value)
    return fut


def submit(
    executor: concurrent.futures.Executor, fn: Callable[..., T], *args: Any, **kwargs: Any
) -> LocalFuture[T]:
    """Run `fn` on `executor` and report its outcome through a LocalFuture."""
    fut, work = task(fn, *args, **kwargs)
    executor.submit(work)
    return fut


def task(
    fn: Callable[..., T], *args: Any, **kwargs: Any
) -> tuple[LocalFuture[T], Callable[[], None]]:
    """A future and the call that runs `fn` and settles it (skipped if it was cancelled)."""
    fut: LocalFuture[T] = LocalFuture()

    def work() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:  # every failure belongs to the caller, even KeyboardInterrupt
            fut.set_exception(exc)
        else:
            fut.set_result(value)

    return fut, work
