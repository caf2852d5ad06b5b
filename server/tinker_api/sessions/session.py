"""What the server holds of a Tinker session while it lives: its models and samplers, when it
was last heard from, what its current optimizer step has trained and sampled so far, the
answers of its requests by idempotency key, and once it ended, why. The session keeps its own
story: its tally, its steps, checkpoints and end, each written to its run (a Recorder) and a
line of its log."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from core.models import RunStatus, iso, utcnow
from core.rollouts import Kind, RolloutRecord, Segment
from core.tinker_wire import ModelReady, RolloutText, Sampled, Stepped, Trained
from server.tinker_api.schemas import JsonObject
from server.tinker_api.sessions.records import Recorder
from server.tinker_api.sessions.trace import RequestSpan, SessionTrace

log = logging.getLogger(__name__)
# A step's samples and datums kept for its rollouts (the record keeps rollouts_per_step of them,
# 256 by default): what the step sampled past this many is counted in its tokens only.
MAX_STEP_ROLLOUTS = 2048


@dataclass
class Model:
    model_id: str
    seq: int
    base_model: str
    lora_rank: int | None
    user_metadata: dict[str, Any] | None
    ready: bool = False
    arch: str | None = None  # from the worker, once ready
    tokenizer_id: str | None = None
    created_at: str | None = field(default_factory=lambda: iso(utcnow()))

    def record(self) -> JsonObject:
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
    clients: int = 0  # clients that joined it (join_sampling_session); the first is 0


@dataclass
class StepTally:
    """What an optimizer step's metrics count, gathered since the previous step."""

    loss: float = 0.0
    trained_tokens: int = 0
    sampled_tokens: int = 0
    device_s: float = 0.0  # the union of its requests' runs in the worker
    started: float = 0.0
    # What it sampled and trained, as rollouts (DESIGN §14): the first MAX_STEP_ROLLOUTS.
    rollouts: list[RolloutRecord] = field(default_factory=list)
    groups: int = 0  # its sample requests and forward_backward calls so far


@dataclass
class Session:
    id: str  # the run's id
    run_dir: Path
    recorder: Recorder = field(repr=False)
    clock: Callable[[], float] = field(repr=False)
    last_seen: float = 0.0
    models: dict[int, Model] = field(default_factory=dict)
    samplers: dict[str, Sampler] = field(default_factory=dict)
    step: int = 0
    tally: StepTally = field(default_factory=StepTally)
    ended: str | None = None  # what a request of an ended session is told
    ended_at: float | None = None
    uses_worker: bool = False  # it has models or samplers in an engine host
    # The engine host it was placed on at its first model or sampler (its index among this
    # machine's hosts): every request of its goes there, its snapshots live there.
    host: int | None = None
    # Its client's requests being answered now (a held poll, a POST waiting for the worker):
    # a client waiting on us is not quiet.
    waiting: int = 0
    trace: SessionTrace = field(default_factory=SessionTrace)
    _answers: dict[Hashable, asyncio.Future[JsonObject]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.last_seen = self.clock()

    # Its client ---------------------------------------------------------------------------

    def seen(self) -> None:
        self.last_seen = self.clock()

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Its client waits on us meanwhile (it is not quiet, whatever the time)."""
        self.waiting += 1
        try:
            yield
        finally:
            self.waiting -= 1
            self.seen()

    def quiet_for(self) -> float:
        """How long its client has sent nothing and waited on nothing."""
        return 0.0 if self.waiting else self.clock() - self.last_seen

    async def once(self, key: Hashable, make: Callable[[], Awaitable[JsonObject]]) -> JsonObject:
        """The answer of the request `key` names (a model and its sequence id): made by the
        first POST, given again to a retry of it, which so is applied once. A request that
        failed is forgotten: a retry tries again."""
        known = self._answers.get(key)
        if known is not None:
            return await asyncio.shield(known)
        answer: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
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

    # Its models and samplers -------------------------------------------------------------

    def add_model(self, model: Model) -> None:
        """A model being made (ready once the worker answers; a retried request replaces
        nothing: its sequence id is its key)."""
        self.models[model.seq] = model

    def add_sampler(self, sampler: Sampler) -> None:
        """A sampler, unless one of its id is there already (a retried request)."""
        self.samplers.setdefault(sampler.sampler_id, sampler)

    # Its story ----------------------------------------------------------------------------

    def note(self, line: str) -> None:
        """A line of its story in its run's log (GET /runs/{id}/logs)."""
        self.recorder.log(self.run_dir, line)

    def model_ready(self, model: Model, ready: ModelReady) -> None:
        model.base_model = ready.base_model or model.base_model
        model.lora_rank = ready.lora_rank
        model.arch, model.tokenizer_id = ready.arch, ready.tokenizer_id
        model.ready = True
        self.recorder.model(self.id, model.seq, model.record())
        self.note(f"model {model.model_id}: {model.base_model}, LoRA rank {model.lora_rank}")

    def trained(self, trained: Trained) -> None:
        """A forward_backward's share of the current step (a forward alone has none)."""
        if not trained.forward_only:
            self.tally.loss += float(trained.loss or 0.0)
            self.tally.trained_tokens += trained.tokens
            self._rollouts("datum", trained.records)

    def timed(self, name: str, track: str, submitted: float, run_s: float, failed: bool) -> None:
        """A request answered: its span in the trace, its run in the step's device time."""
        span = RequestSpan(name, track, submitted, time.time(), run_s, failed)
        self.tally.device_s += self.trace.add(span)

    def sampled(self, sampled: Sampled) -> None:
        self.tally.sampled_tokens += sampled.tokens
        self._rollouts("sample", sampled.records)

    def _rollouts(self, kind: Kind, texts: list[RolloutText]) -> None:
        """A request's samples or datums, one group, kept for its step's rollouts."""
        tally, group = self.tally, self.tally.groups
        tally.groups += 1
        for text in texts[: max(0, MAX_STEP_ROLLOUTS - len(tally.rollouts))]:
            tally.rollouts.append(
                RolloutRecord(
                    kind=kind,
                    group=group,
                    index=len(tally.rollouts),
                    prompt=text.prompt,
                    completion=text.completion,
                    reward=None,  # the server never sees one
                    advantage=text.advantage,
                    segments=[
                        Segment("env", text.prompt, text.prompt_tokens),
                        Segment(
                            "model", text.completion, text.completion_tokens, None, text.advantage
                        ),
                    ],
                    finish_reason=text.finish_reason,
                    prompt_tokens=text.prompt_tokens,
                    completion_tokens=text.completion_tokens,
                    logprob_mean=text.logprob_mean,
                    trained=kind == "datum",
                )
            )

    def stepped(self, stepped: Stepped) -> None:
        """An optimizer step: its metrics and the tally since the last one, recorded."""
        metrics, tally, now = stepped.metrics, self.tally, self.clock()
        self.step += 1
        values = {
            "train/loss": tally.loss,
            "train/grad_norm": metrics.get("grad_norm"),
            "train/learning_rate": metrics.get("learning_rate"),
            "train/tokens": tally.trained_tokens,
            "sampler/tokens": tally.sampled_tokens,
            "time/device_s": tally.device_s,
            "time/step_s": now - tally.started if tally.started else None,
        }
        self.tally = StepTally(started=now)
        self.recorder.step(self.id, self.step, values)
        if tally.rollouts:
            self.recorder.rollouts(self.run_dir, self.id, self.step, tally.rollouts)
        self.note(
            f"step {self.step}: loss {tally.loss:.4g}, grad norm "
            f"{metrics.get('grad_norm', float('nan')):.4g}, {tally.trained_tokens} tokens "
            f"trained, {tally.sampled_tokens} sampled"
        )

    def saved(
        self, kind: str, name: str, folder: str, path: str, expires_at: datetime | None
    ) -> None:
        """A checkpoint (`path`, its tinker:// name) at the current step, kept until
        `expires_at` (its ttl_seconds) if given."""
        self.recorder.checkpoint(self.id, self.step, kind, name, folder, expires_at)
        until = f" (expires {iso(expires_at)})" if expires_at else ""
        self.note(f"saved {path}{until}")

    def end(
        self, status: RunStatus, failure_kind: str | None, told: str, details: str | None
    ) -> str | None:
        """End once: `told` is what its script's later requests are told. The whole message
        they get, or None when it had ended already."""
        if self.ended is not None:
            return None
        self.ended = f"This Tinker session (run {self.id}) has ended: {told}."
        self.ended_at = self.clock()
        why = details or told
        self.note(f"session ended ({status.value}): {why}")
        self.recorder.trace(self.run_dir, self.trace.chrome_trace(self.id))
        self.recorder.end(self.id, status, failure_kind, why)
        log.info("Tinker session %s ended (%s): %s", self.id, status.value, why)
        return self.ended
