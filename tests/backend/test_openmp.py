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
    _on_a_thread(_first_region)
    yield
    openmp.set_sole_engine(False)


def _tasks() -> set[int]:
    """The process's threads, by id (other tests' threads may come and go meanwhile, so a
    check names the threads it means rather than counting)."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _pool_of(work: Callable[[], None]) -> set[int]:
    """The threads `work` started and left running: the calling thread's new OpenMP pool."""
    before = _tasks()
    work()
    return _tasks() - before


def _parallel_region() -> None:
    """An operation torch splits among OpenMP threads: the calling thread gets a pool."""
    torch.set_num_threads(2)
    torch.ones(1 << 20).add_(1.0)


def _first_region() -> None:
    """A parallel region, and its pool given back: the threads the process's first region
    starts once (and keeps) are there before a test counts a pool."""
    _parallel_region()
    openmp.give_back_workers()


def _gone(threads: set[int], within_s: float = 10) -> bool:
    """Whether all of `threads` have left the process within `within_s` (a pool's workers exit
    just after they are told)."""
    deadline = time.monotonic() + within_s
    while threads & _tasks() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not threads & _tasks()


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
        pool = _pool_of(_parallel_region)
        assert pool, "torch made no OpenMP workers for this thread"
        openmp.give_back_workers()
        assert _gone(pool)
        assert _pool_of(_parallel_region)  # a new pool when it works again

    _on_a_thread(work)


def test_another_threads_pool_stays():
    ready, done = threading.Event(), threading.Event()
    kept: set[int] = set()

    def keeper() -> None:
        kept.update(_pool_of(_parallel_region))
        ready.set()
        done.wait()

    thread = threading.Thread(target=keeper)
    thread.start()
    try:
        assert ready.wait(30) and kept

        def work() -> None:
            openmp.give_back_workers()  # this thread has no pool: nothing goes

        _on_a_thread(work)
        assert kept <= _tasks()
    finally:
        done.set()
        thread.join()


def test_the_loaders_executor_gives_back_after_each_task():
    with openmp.WorkersFreeExecutor(max_workers=1) as loader:
        pool = loader.submit(_pool_of, _parallel_region).result()  # seen before the task ends
        assert pool, "torch made no OpenMP workers for the loader's thread"
        assert _gone(pool)


def test_an_engine_among_others_keeps_its_pools():
    openmp.set_sole_engine(False)

    def work() -> None:
        pool = _pool_of(_parallel_region)
        assert pool
        openmp.give_back_workers()
        assert not _gone(pool, within_s=1)  # its workers stay

    _on_a_thread(work)
