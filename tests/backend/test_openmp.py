"""In the sole engine, a thread done with torch gives back its OpenMP workers (libgomp's pool of
that thread), and the loader's executor does so after each task; another thread's pool stays;
an engine among others keeps its pools."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from runners.engine import openmp


@pytest.fixture(autouse=True)
def _sole_engine() -> Iterator[None]:
    if openmp._pause_all() is None:
        pytest.skip("torch runs on no libgomp here (its OpenMP pools are not ours to end)")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: torch makes no OpenMP workers")
    openmp.set_sole_engine(True)
    yield
    openmp.set_sole_engine(False)


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def _parallel_region() -> None:
    """An operation torch splits among OpenMP threads: the calling thread gets a pool."""
    torch.set_num_threads(2)
    torch.ones(1 << 20).add_(1.0)


def _tasks_become(count: int, within_s: float = 10) -> int:
    """The thread count once it is `count` (a pool's workers exit just after they are told),
    or what it is after `within_s`."""
    deadline = time.monotonic() + within_s
    while _tasks() != count and time.monotonic() < deadline:
        time.sleep(0.01)
    return _tasks()


def _on_a_thread(work: Callable[[], None]) -> None:
    """`work` on a new thread, returning once that thread is gone from the process."""
    failure: list[BaseException] = []
    native: list[int] = []

    def run() -> None:
        native.append(threading.get_native_id())
        try:
            work()
        except BaseException as exc:  # reported on the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/self/task/{native[0]}") and time.monotonic() < deadline:
        time.sleep(0.01)
    if failure:
        raise failure[0]


def test_a_thread_gives_back_its_workers():
    def work() -> None:
        _parallel_region()
        with_pool = _tasks()
        openmp.give_back_workers()
        assert _tasks_become(with_pool - 1) == with_pool - 1
        _parallel_region()  # a new pool when it works again
        assert _tasks() == with_pool

    _on_a_thread(work)


def test_another_threads_pool_stays():
    ready, done = threading.Event(), threading.Event()

    def keeper() -> None:
        _parallel_region()
        ready.set()
        done.wait()

    thread = threading.Thread(target=keeper)
    thread.start()
    try:
        assert ready.wait(30)
        before = _tasks()

        def work() -> None:
            openmp.give_back_workers()  # this thread has no pool: nothing goes

        _on_a_thread(work)
        assert _tasks() == before
    finally:
        done.set()
        thread.join()


def test_the_loaders_executor_gives_back_after_each_task():
    with openmp.WorkersFreeExecutor(max_workers=1) as loader:
        idle = loader.submit(_tasks).result()  # its thread, with no pool yet
        assert loader.submit(lambda: (_parallel_region(), 7)[1]).result() == 7
        assert loader.submit(lambda: _tasks_become(idle)).result() == idle


def test_an_engine_among_others_keeps_its_pools():
    openmp.set_sole_engine(False)

    def work() -> None:
        _parallel_region()
        with_pool = _tasks()
        openmp.give_back_workers()
        assert _tasks_become(with_pool - 1, within_s=1) == with_pool  # its worker stays

    _on_a_thread(work)
