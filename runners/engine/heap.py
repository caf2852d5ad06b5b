"""Freed heap memory given back to the system after a training pass, and when a client, a
sampler, a host or a base goes (glibc's `malloc_trim`; nothing where the C library lacks
it)."""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from typing import Any


@functools.cache
def _malloc_trim() -> Callable[[int], Any] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)  # glibc's; musl has none


def give_back_free_memory() -> None:
    """Return the free pages of every malloc arena to the system. A pass's activations are
    freed into the arena of the thread that ran it, and each training client has its own
    thread: without this, every client on a shared engine keeps the peak of its last pass."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
