"""Sampled sequences recorded for `stable_reinforce`: tokens and sampler logprobs by sequence id.

A sampling client made with `record_stability_info=True` records every sequence it samples
here; training datums then name spans of them (`Datum.with_provenance`). One store per
LocalServiceClient, shared by its clients; an entry lives `ttl_s` after its last use (recorded
or read) and the least recently used go first once the store passes `max_bytes`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# The SDK's words: recorded data "expires after inactivity"; Tinker keeps it a day.
DEFAULT_TTL_S = 24 * 3600.0
# 512 MiB: 64 million sampled tokens (a token id and a logprob, 4 bytes each), prompts counted
# once per sequence. RL reads a sequence a few steps after sampling it.
DEFAULT_MAX_BYTES = 512 * 2**20


class UnknownSequence(ValueError):
    """A datum names a sequence the store does not hold (a user error: ValueError)."""


@dataclass(frozen=True)
class RecordedSequence:
    """One sampled sequence: its request's prompt, its sampled tokens and their logprobs."""

    prompt: np.ndarray  # int32; shared by the samples of one request
    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float32, the sampler's, one per sampled token

    @property
    def nbytes(self) -> int:
        return int(self.prompt.nbytes + self.tokens.nbytes + self.logprobs.nbytes)


@dataclass
class _Entry:
    sequence: RecordedSequence
    last_used: float


class SequenceStore:
    """Recorded sequences by id, thread-safe (the sampler records, the trainer reads)."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0 or max_bytes <= 0:
            raise ValueError("a SequenceStore needs a positive ttl_s and max_bytes")
        self.ttl_s = float(ttl_s)
        self.max_bytes = int(max_bytes)
        self._clock = clock
        self._lock = threading.Lock()
        # Oldest use first: expiry and eviction both take from the front.
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0

    def record(self, sequence_id: str, sequence: RecordedSequence) -> None:
        """Keep `sequence` under `sequence_id` (replacing an older one of that id)."""
        with self._lock:
            now = self._clock()
            self._drop(sequence_id)
            self._entries[sequence_id] = _Entry(sequence, now)
            self._bytes += sequence.nbytes
            self._expire(now)
            while self._bytes > self.max_bytes and self._entries:
                self._drop(next(iter(self._entries)))

    def get(self, sequence_id: str) -> RecordedSequence:
        """The recorded sequence (a use: its lifetime starts again), or UnknownSequence."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            entry = self._entries.get(sequence_id)
            if entry is None:
                raise UnknownSequence(
                    f"sequence {sequence_id!r} is not recorded: unknown, expired "
                    f"({self.ttl_s / 3600:g} h after its last use) or evicted (the store keeps "
                    f"{self.max_bytes / 2**20:g} MiB); sample it with a sampling client made "
                    "with record_stability_info=True and train on it soon after"
                )
            entry.last_used = now
            self._entries.move_to_end(sequence_id)
            return entry.sequence

    def forget(self, prefix: str) -> int:
        """Drop every sequence whose id starts with `prefix` (a Tinker session's, once it
        ended); how many."""
        with self._lock:
            gone = [i for i in self._entries if i.startswith(prefix)]
            for sequence_id in gone:
                self._drop(sequence_id)
        return len(gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def _expire(self, now: float) -> None:
        while self._entries:
            oldest_id, oldest = next(iter(self._entries.items()))
            if now - oldest.last_used < self.ttl_s:
                return
            self._drop(oldest_id)

    def _drop(self, sequence_id: str) -> None:
        entry = self._entries.pop(sequence_id, None)
        if entry is not None:
            self._bytes -= entry.sequence.nbytes
