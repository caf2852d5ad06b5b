"""What the server holds of a Tinker session while it lives: its models and samplers, when it
was last heard from, what its current optimizer step has trained and sampled so far, the
answers of its requests by idempotency key, and once it ended, why."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.models import iso, utcnow


@dataclass
class Model:
    model_id: str
    seq: int
    base_model: str
    lora_rank: int | None
    user_metadata: dict[str, Any] | None
    ready: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # arch, tokenizer_id (from the engine)
    created_at: str | None = field(default_factory=lambda: iso(utcnow()))

    def record(self) -> dict[str, Any]:
        """What the run's config keeps of it (RestClient's training runs read it back)."""
        return {
            "model_id": self.model_id,
            "base_model": self.base_model,
            "lora_rank": self.lora_rank,
            "user_metadata": self.user_metadata,
            "created_at": self.created_at,
        }


@dataclass
class Sampler:
    sampler_id: str
    base_model: str
    model_path: str | None


@dataclass
class StepTally:
    """What an optimizer step's metrics count, gathered since the previous step."""

    loss: float = 0.0
    trained_tokens: int = 0
    sampled_tokens: int = 0
    started: float = 0.0


@dataclass
class Session:
    id: str  # the run's id
    run_dir: Path
    last_seen: float
    models: dict[int, Model] = field(default_factory=dict)
    samplers: dict[str, Sampler] = field(default_factory=dict)
    step: int = 0
    tally: StepTally = field(default_factory=StepTally)
    ended: str | None = None  # what a request of an ended session is told
    ended_at: float | None = None
    uses_engine: bool = False
    # Its client's requests being answered now (a held poll, a POST waiting for the engine):
    # a client waiting on us is not quiet.
    waiting: int = 0
    _answers: dict[Hashable, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)

    async def once(
        self, key: Hashable, make: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """The answer of the request `key` names (a model and its sequence id): made by the
        first POST, given again to a retry of it, which so is applied once. A request that
        failed is forgotten: a retry tries again."""
        known = self._answers.get(key)
        if known is not None:
            return await asyncio.shield(known)
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._answers[key] = answer
        try:
            made = await make()
        except BaseException as exc:
            del self._answers[key]
            if isinstance(exc, Exception):
                answer.set_exception(exc)
                answer.exception()  # retrieved: a retry waiting on it raises it, nobody else
            else:
                answer.cancel()  # the POST was cancelled (its client went away)
            raise
        answer.set_result(made)
        return made
