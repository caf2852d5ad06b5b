"""The policy the episodes sample from: a sampling client plus the run's sampling settings."""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from tinker import types

T = TypeVar("T")


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" (a stop token or string) or "length" (a limit, or the deadline)
    # The sampler's id for it (a sampler made with record_stability_info recorded it under this
    # id: stable_reinforce datums name it); None where the backend gave none.
    sequence_id: str | None = None


class SamplerPolicy:
    """One completion per call; each call gets its own seed so a group's samples differ:
    counting up from `seed` call by call, or, in a policy made by `episode(k)`, the episode's
    own (`seed + k` for its first turn), whatever order concurrent episodes call in.

    `deadline` (time.monotonic()) and `cancel` (an event) are for the local backend only:
    sampling stops at the deadline, or at the next decode step once `cancel` is set.
    """

    def __init__(
        self,
        client: Any,
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        stop: list[int],
        seed: int | None,
        timeout_s: float | None = None,
        deadline: float | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self._client = client
        self._extra: dict[str, Any] = {"deadline": deadline} if deadline is not None else {}
        if cancel is not None:
            self._extra["cancel"] = cancel
        self.max_tokens = max_tokens
        self._params = types.SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, stop=stop
        )
        self._seed = seed
        self._seeds: Iterator[int] | None = itertools.count(seed) if seed is not None else None
        self._timeout_s = timeout_s

    def episode(self, index: int) -> SamplerPolicy:
        """This policy for the `index`-th episode of a batch: turn t samples with seed
        `seed + index + t * 2**32`, so an episode draws the same whenever its turns come (the
        order concurrent episodes reach the sampler depends on timing). Single-turn episodes
        keep the seeds call counting gave them in order."""
        own = copy.copy(self)
        if self._seed is not None:
            first = self._seed + index
            own._seeds = (first + (turn << 32) for turn in itertools.count())
        return own

    async def sample(self, prompt_tokens: list[int]) -> tuple[list[int], list[float]]:
        completion = await self.complete(prompt_tokens)
        return completion.tokens, completion.logprobs

    async def complete(self, prompt_tokens: list[int]) -> Completion:
        params = self._params.model_copy(
            update={"seed": next(self._seeds) if self._seeds is not None else None}
        )
        response = await bounded(
            self._client.sample(
                prompt=types.ModelInput.from_ints(prompt_tokens),
                num_samples=1,
                sampling_params=params,
                **self._extra,
            ),
            self._timeout_s,
            "sample",
        )
        sequence = response.sequences[0]
        tokens = list(sequence.tokens)
        logprobs = list(sequence.logprobs) if sequence.logprobs is not None else [0.0] * len(tokens)
        return Completion(
            tokens, logprobs, sequence.stop_reason, getattr(sequence, "sequence_id", None)
        )


async def bounded(call: Awaitable[T], timeout_s: float | None, what: str) -> T:
    """Await a backend call for at most `timeout_s` (the hosted SDK would otherwise wait on a
    stuck request indefinitely); a timeout becomes an error that names the call."""
    try:
        return await asyncio.wait_for(asyncio.ensure_future(call), timeout_s)
    except TimeoutError:
        raise TimeoutError(f"{what} did not finish within {timeout_s:g} s") from None
