"""OpenMP workers given back by a thread that is done with torch for now (libgomp's
`omp_pause_resource_all`, the runtime torch loaded; nothing where there is none), in the
process that is the machine's one engine (the engine host).

libgomp keeps a pool of workers for each thread that ran a parallel region, and once a process
holds more of them than it has cores, every pool's workers spin only briefly before they sleep:
the decode thread's then sleep between a step's products, and each product waits for its
workers to wake. In the sole engine, a training client's thread gives its pool back when its
turn is over and the decode thread when its batch is empty, so a busy thread's workers spin.
Engines among others (private runs, several processes on the same cores) keep their pools:
there, spinning workers would take the cores from each other's work, which the brief spin
spares them. Figures: benchmarks/README.md, "The fused kernel and idle OpenMP pools"."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

OMP_PAUSE_SOFT = 1  # omp.h's omp_pause_soft: the workers go, the settings stay


@functools.cache
def _pause_all() -> Callable[[int], Any] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:  # only a libgomp already loaded (torch's): a fresh one would hold no pool of ours
        gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return None
    return getattr(gomp, "omp_pause_resource_all", None)


_sole_engine = False


def set_sole_engine(sole: bool) -> None:
    """Whether this process is the machine's one engine (idle threads give back their pools)."""
    global _sole_engine
    _sole_engine = sole


def give_back_workers() -> None:
    """End the calling thread's OpenMP pool in the sole engine (a later parallel region makes
    a new one); elsewhere nothing."""
    pause = _pause_all()
    if _sole_engine and pause is not None:
        pause(OMP_PAUSE_SOFT)


class WorkersFreeExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose threads give back their OpenMP workers after each task (a
    loader that runs now and then)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return super().submit(_then_give_back, fn, *args, **kwargs)


def _then_give_back(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    finally:
        give_back_workers()
