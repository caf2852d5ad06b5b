"""Test inference: resolve environment, model and adapter, ask the worker, summarise.

Each answer comes within the time budget (RLCS_INFERENCE_BUDGET_S): what the model has not
finished by then is returned cut short, marked so. The default model is loaded at start-up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from core.checkpoint_check import SAMPLER_KIND
from core.model_names import LOCAL_DEFAULT_MODEL
from core.models import TINKER_API
from core.settings import Settings
from core.spec import InferenceJob, WarmJob
from server.environments.catalog import EnvEntry
from server.environments.configs import ConfigService, Resolved
from server.environments.model_check import ModelCheck
from server.errors import DomainError, NotFound, Unavailable
from server.inference.schemas import (
    InferenceIn,
    InferenceOut,
    InferenceResult,
    InferenceSummaryOut,
)
from server.inference.worker import InferenceWorker
from server.runs.service import RunService

log = logging.getLogger(__name__)
WARMUP_TIMEOUT_S = 900.0  # a first start converts SmolLM2 from its GGUF (tens of seconds)
CLIENT_POLL_S = 0.25  # how often a request in flight checks that its client is still there


@dataclass(frozen=True)
class Target:
    """What a request samples: the environment (entry, resolved config), the model, and the
    trained adapter when it names a run."""

    entry: EnvEntry
    config: Resolved
    model: str
    adapter: str | None


class InferenceService:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        configs: ConfigService,
        runs: RunService,
        worker: InferenceWorker,
        models: ModelCheck,
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._configs = configs
        self._runs = runs
        self.worker = worker
        self._models = models

    async def infer_for(
        self, body: InferenceIn, disconnected: Callable[[], Awaitable[bool]]
    ) -> InferenceOut:
        """`infer` in a thread, cancelling the work in the worker if the client goes away."""
        abandoned = threading.Event()
        answer = asyncio.ensure_future(asyncio.to_thread(self.infer, body, abandoned))
        while not answer.done():
            await asyncio.wait({answer}, timeout=CLIENT_POLL_S)
            if not answer.done() and await disconnected():
                abandoned.set()  # the worker stops decoding at its next step
                break
        return await answer

    def infer(self, body: InferenceIn, abandoned: threading.Event | None = None) -> InferenceOut:
        arrived = time.time()
        budget = min(self._settings.inference_budget_s, self._settings.inference_timeout_s)
        target = self._target(body)
        if body.num_items:  # it plays its own items: it must load (verifiers: tried first)
            self._configs.check_starts(target.entry.name, target.config)
        job = InferenceJob(
            source=target.entry.source(target.config.model_dump(mode="json")),
            model=target.model,
            adapter=target.adapter,
            prompts=body.prompts,
            num_items=body.num_items,
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            seed=body.seed,
            deadline=arrived + budget,
            budget_s=budget,
        )
        answer = self.worker.request(
            job,
            self._settings.inference_timeout_s,
            queue_s=budget - (time.time() - arrived),
            abandoned=abandoned,
        )
        if not answer.get("ok"):
            raise _error_for(answer, target.model)
        results = [InferenceResult.model_validate(result) for result in answer["results"]]
        return InferenceOut(
            environment=target.entry.name,
            model=target.model,
            adapter=target.adapter,
            backend=answer["backend"],
            results=results,
            summary=summarize(results, answer["latency_s"]),
        )

    def _target(self, body: InferenceIn) -> Target:
        """The environment, model and adapter a request samples: a run's (its trained adapter)
        or, without a run, the environment's model or the one asked for, checked."""
        if body.run_id is None:
            name = body.environment or self._configs.selected()
            entry, config = self._configs.resolve(name)
            model = body.model or config.model_name
            field = "model" if body.model is not None else "model_name (from the config)"
            self._models.check(model, config.backend, field, "sample", error=NotFound)
            return Target(entry, config, model, adapter=None)
        run = self._runs.row(body.run_id)
        if run.source == TINKER_API:
            # A Tinker session trained no environment: score with the one asked for (or
            # the selected one), sampling the session's model.
            trained = json.loads(run.config_json).get("model_name")
            name = body.environment or self._configs.selected()
            entry, config = self._configs.resolve(name, {"model_name": trained})
        else:
            spec = self._runs.spec(run)
            name = body.environment or run.environment
            base = spec.config if name == run.environment else {}
            entry, config = self._configs.revalidate(name, base, {})
        adapter = self.adapter(body.run_id, body.checkpoint_step)
        return Target(entry, config, config.model_name, adapter)

    def warm_up(self) -> None:
        """Load the model a first request would use, and start the inference client, in the
        background (local backend)."""
        settings = self._settings
        if not settings.inference_warmup or settings.default_backend != "local":
            return
        threading.Thread(target=self._warm, name="inference-warm-up", daemon=True).start()

    def _warm(self) -> None:
        try:
            self.worker.client.life()  # the inference client's imports, paid before a request
            model = self._default_model()
            started = time.monotonic()
            answer = self.worker.request(WarmJob(model=model, backend="local"), WARMUP_TIMEOUT_S)
        except Exception as exc:  # a failed warm-up only costs the first request its speed
            log.warning("inference warm-up did not finish: %s", exc)
            return
        if answer.get("ok"):
            log.info("inference worker warm: %s in %.1f s", model, time.monotonic() - started)
        else:
            log.warning("inference warm-up failed: %s", answer.get("error"))

    def _default_model(self) -> str:
        """The selected environment's model when it runs locally, else the local default."""
        try:
            _, config = self._configs.resolve(self._configs.selected())
        except DomainError:  # nothing selected, or it does not import
            return LOCAL_DEFAULT_MODEL
        if self._models.backend_for(config.backend) != "local":
            return LOCAL_DEFAULT_MODEL
        return config.model_name

    def adapter(self, run_id: str, step: int | None) -> str:
        """The path of a run's sampler checkpoint at `step` (default: its latest)."""
        return self._runs.checkpoint(run_id, SAMPLER_KIND, step, "sample", verify=False).path


def summarize(results: list[InferenceResult], latency_s: float) -> InferenceSummaryOut:
    scored = [r.score for r in results if r.score is not None]
    return InferenceSummaryOut(
        count=len(results),
        scored=len(scored),
        mean_score=sum(scored) / len(scored) if scored else None,
        # Of the results scored: an unscored one (a free prompt, a failure) is not wrong.
        percent_correct=(
            100.0 * sum(1 for r in results if r.correct) / len(scored) if scored else None
        ),
        tokens=sum(r.tokens for r in results),
        truncated=sum(1 for r in results if r.truncated),
        latency_s=latency_s,
    )


def _error_for(answer: dict[str, Any], model: str) -> Exception:
    kind, error = answer.get("kind"), answer.get("error", "unknown error")
    if kind == "model":
        return NotFound(f"model: {error}")
    if kind == "backend":
        return Unavailable(f"the training backend is not usable for inference: {error}")
    return Unavailable(f"inference failed for model {model}: {error}")
