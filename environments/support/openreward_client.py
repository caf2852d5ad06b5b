"""OpenReward client plumbing for the adapter: a client with no update check, and which task
(split, index) a seed stands for, with per-split task counts cached per process."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol

_counts: dict[tuple[str | None, str, str], int] = {}


class SplitSpec(Protocol):
    shuffle: bool
    num_samples: int | None


def disable_update_check() -> None:
    """The SDK would GET PyPI from a thread on every new client unless told not to; marking the
    check done has the effect of OPENREWARD_DISABLE_UPDATE_CHECK=1 without touching os.environ."""
    try:
        from openreward import _update_check

        with _update_check._checked_lock:
            _update_check._checked = True
    except (ImportError, AttributeError):  # a later SDK may move it; the check is harmless
        pass


def make_client(api_key: str | None) -> Any:
    from openreward import AsyncOpenReward

    disable_update_check()
    return AsyncOpenReward(api_key=api_key or None)


async def task_count(env: Any, base_url: str | None, split: str) -> int:
    key = (base_url, env.deployment_name, split)
    if key not in _counts:
        _counts[key] = int(await env.num_tasks(split))
    return _counts[key]


async def pick_task(
    env: Any,
    base_url: str | None,
    splits: Mapping[str, SplitSpec],
    seed: int,
) -> tuple[str, int]:
    """The task a seed stands for: seed modulo the pool made of every configured split's
    tasks (each cut to num_samples; shuffle picks which ones, with a fixed seed)."""
    segments: list[tuple[str, Sequence[int]]] = []
    for name, spec in splits.items():
        count = await task_count(env, base_url, name)
        segments.append((name, _indices(env.deployment_name, name, count, spec)))
    total = sum(len(indices) for _, indices in segments)
    if total == 0:
        raise ValueError(
            f"OpenReward environment {env.deployment_name!r} has no tasks in "
            f"split(s) {', '.join(splits)}"
        )
    position = seed % total
    for name, indices in segments:
        if position < len(indices):
            return name, indices[position]
        position -= len(indices)
    raise AssertionError("unreachable: position is below the pool size")


def _indices(environment: str, split: str, count: int, spec: SplitSpec) -> Sequence[int]:
    wanted = count if spec.num_samples is None else min(spec.num_samples, count)
    if wanted == count:
        # Episodes draw random seeds anyway, so shuffling a whole split changes nothing.
        return range(count)
    if not spec.shuffle:
        return range(wanted)
    return _subset(environment, split, count, wanted)


@lru_cache(maxsize=64)
def _subset(environment: str, split: str, count: int, wanted: int) -> list[int]:
    # Seeded by name so every process (runner, worker) picks the same tasks.
    return sorted(random.Random(f"{environment}/{split}").sample(range(count), wanted))
