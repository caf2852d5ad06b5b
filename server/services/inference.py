"""Test inference: resolve environment, model and adapter, ask the worker, summarise."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from server.db import read_session
from server.errors import Conflict, InvalidValue, NotFound, Unavailable
from server.models import Checkpoint
from server.schemas import InferenceIn
from server.services.configs import ConfigService
from server.services.inference_worker import InferenceWorker
from server.services.runs import RunService
from server.settings import Settings


class InferenceService:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        configs: ConfigService,
        runs: RunService,
        worker: InferenceWorker,
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._configs = configs
        self._runs = runs
        self.worker = worker

    def infer(self, body: InferenceIn) -> dict[str, Any]:
        count = len(body.prompts) if body.prompts is not None else body.num_items or 0
        if count > self._settings.inference_max_prompts:
            raise InvalidValue(
                f"prompts: at most {self._settings.inference_max_prompts} per request "
                f"(got {count}); split them over several requests."
            )
        adapter = None
        if body.run_id is not None:
            run = self._runs.row(body.run_id)
            frozen = self._runs.frozen(run)
            name = body.environment or run.environment
            base = frozen["config"] if name == run.environment else {}
            entry, config = self._configs.revalidate(name, base, {})
            adapter = self._adapter(body.run_id, body.checkpoint_step)
            model = config.model_name
        else:
            name = body.environment or self._configs.selected()
            entry, config = self._configs.resolve(name)
            model = body.model or config.model_name
            self._check_model(model, config.backend, explicit=body.model is not None)
        payload = {
            "env_file": str(entry.path),
            "env_class": entry.class_name,
            "config": config.model_dump(mode="json"),
            "model": model,
            "adapter": adapter,
            "prompts": body.prompts,
            "num_items": body.num_items,
            "max_tokens": body.max_tokens,
            "temperature": body.temperature,
            "seed": body.seed,
        }
        answer = self.worker.request(payload, self._settings.inference_timeout_s)
        if not answer.get("ok"):
            raise _error_for(answer, model)
        results = answer["results"]
        return {
            "environment": entry.name,
            "model": model,
            "adapter": adapter,
            "backend": answer["backend"],
            "results": results,
            "summary": summarize(results, answer["latency_s"]),
        }

    def _adapter(self, run_id: str, step: int | None) -> str:
        with read_session(self._engine) as session:
            rows = session.exec(
                select(Checkpoint)
                .where(Checkpoint.run_id == run_id, Checkpoint.kind == "sampler")
                .order_by(col(Checkpoint.step).desc(), col(Checkpoint.id).desc())
            ).all()
        if not rows:
            raise Conflict(
                f"Run {run_id} has no sampler checkpoint yet; wait for its first "
                "checkpoint (save_every) or its end."
            )
        if step is None:
            return rows[0].path
        for row in rows:
            if row.step == step:
                return row.path
        steps = ", ".join(str(r.step) for r in sorted(rows, key=lambda r: r.step))
        raise NotFound(
            f"checkpoint_step: run {run_id} has no checkpoint at step {step}; it has steps {steps}."
        )

    def _check_model(self, model: str, backend: str, explicit: bool) -> None:
        """Refuse a model the local backend cannot load, before waking the worker."""
        chosen = self._settings.default_backend if backend == "auto" else backend
        if chosen != "local":
            return  # hosted models are checked by the service itself
        from runners.models import model_available

        ok, why = model_available(model, self._settings.models_dir, check_hub=False)
        if not ok:
            field = "model" if explicit else "model_name (from the environment's config)"
            raise NotFound(f"{field}: {why}.")


def summarize(results: list[dict[str, Any]], latency_s: float) -> dict[str, Any]:
    scored = [r["score"] for r in results if r.get("score") is not None]
    return {
        "count": len(results),
        "scored": len(scored),
        "mean_score": sum(scored) / len(scored) if scored else None,
        "percent_correct": (
            100.0 * sum(1 for r in results if r.get("correct")) / len(results) if results else None
        ),
        "tokens": sum(int(r.get("tokens") or 0) for r in results),
        "latency_s": latency_s,
    }


def _error_for(answer: dict[str, Any], model: str) -> Exception:
    kind, error = answer.get("kind"), answer.get("error", "unknown error")
    if kind == "model":
        return NotFound(f"model: {error}")
    if kind == "backend":
        return Unavailable(f"the training backend is not usable for inference: {error}")
    return Unavailable(f"inference failed for model {model}: {error}")
