"""What a decoding batch is to the sampling engine: rows (one sequence each, with its own
settings and random stream) that join a running batch and leave the step they finish. Two
batches implement it: `DynamicCacheBatch` (a cache that grows with its rows; the CPU) and
`SlotBatch` (a fixed KV slot per row, decode steps captured as CUDA graphs)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

StopReason = Literal["length", "stop"]  # as tinker's SampledSequence names them


@dataclass
class Row:
    """One sequence to sample, with its own settings and random stream (its seed)."""

    prompt: list[int]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    seed: int
    deadline: float | None = None  # time.monotonic() after which the row stops ("length")
    cancel: threading.Event | None = None  # set: the row stops at the next step ("length")
    # Tokens decoded before a stop id or string may end the row (stop ids cannot be drawn
    # until then), as vLLM's min_tokens.
    min_tokens: int = 0
    # The sampler's adapter slot this row decodes with (-1: the base model alone); set by the
    # scheduler as the row joins a batch.
    adapter_slot: int = -1
    # Told of each token as it is picked (on the scheduler's thread: keep it quick), for streaming.
    on_token: Callable[[int, float], None] | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: StopReason | None = None

    @property
    def filtered(self) -> bool:
        return self.temperature > 0 and (self.top_k > 0 or self.top_p < 1.0)

    @property
    def banning(self) -> bool:
        """Whether the row's stop ids are banned from some of its draws (min_tokens)."""
        return self.min_tokens > 0 and bool(self.stop_ids)


@dataclass(frozen=True)
class Passes:
    """Which optional passes over the vocabulary a step's token selection needs for its rows
    (a captured step is kept per combination)."""

    filtered: bool  # some row uses top-k or top-p (a sort)
    greedy: bool  # some row has temperature 0 (an argmax)
    banning: bool  # some row bans its stop ids until min_tokens

    @staticmethod
    def of(rows: Iterable[Row | None]) -> Passes:
        live = [row for row in rows if row is not None]
        return Passes(
            filtered=any(r.filtered for r in live),
            greedy=any(r.temperature <= 0 for r in live),
            banning=any(r.banning for r in live),
        )


def ban_lists(rows: Sequence[Row | None]) -> list[list[int]]:
    """Each row's stop ids as one width (a row repeats its first id; a row without any gets
    id 0, never banned since its flag stays off), for selection's `ban`."""
    width = max((len(r.stop_ids) for r in rows if r is not None and r.banning), default=1)
    lists = []
    for row in rows:
        ids = sorted(row.stop_ids) if row is not None and row.banning else [0]
        lists.append(ids + [ids[0]] * (width - len(ids)))
    return lists


def record(row: Row, token: int, logprob: float) -> None:
    """Append a picked token to its row, telling the row's listener if it has one."""
    row.tokens.append(token)
    row.logprobs.append(logprob)
    if row.on_token is not None:
        row.on_token(token, logprob)


def finished(row: Row, decode: Callable[[list[int]], str], max_positions: int | None) -> bool:
    token = row.tokens[-1]
    stops = len(row.tokens) >= row.min_tokens  # before that, nothing but the length stops it
    if stops and token in row.stop_ids:
        row.stop_reason = "stop"
    elif stops and row.stop_strings and any(s in decode(row.tokens) for s in row.stop_strings):
        row.stop_reason = "stop"
    elif len(row.tokens) >= row.max_tokens:
        row.stop_reason = "length"
    elif max_positions is not None and len(row.prompt) + len(row.tokens) >= max_positions:
        row.stop_reason = "length"
    elif row.deadline is not None and time.monotonic() >= row.deadline:
        row.stop_reason = "length"
    elif row.cancel is not None and row.cancel.is_set():
        row.stop_reason = "length"
    return row.stop_reason is not None


class DecodeBatch(Protocol):
    """The rows decoding now; the scheduler adds rows between steps and takes finished ones."""

    def __len__(self) -> int:
        """Rows decoding now."""
        ...

    def can_take(self, rows: list[Row]) -> bool:
        """Whether `rows` fit beside the running ones now (else they wait for rows to drain)."""
        ...

    def join(self, rows: list[Row]) -> list[Row]:
        """Prefill `rows` and add them; returns rows that finished at once."""
        ...

    def step(self) -> list[Row]:
        """Pick one token for every row; returns the rows that finished and left."""
        ...
