"""Model ids of the OpenAI-compatible endpoint: a base model (the selected environment's, or
one that loads offline here), a run (`r-3f9c2a1b`: its latest sampler checkpoint) or a run
at a step (`r-3f9c2a1b@step-10`). Resolves an id to what the worker samples, and lists them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from core.db import read_session
from core.model_names import known_models
from core.models import Checkpoint, Run
from server.environments.configs import ConfigService
from server.environments.model_check import ModelCheck
from server.errors import Conflict, DomainError, NotFound
from server.inference.service import InferenceService
from server.openai_compat.schemas import ModelOut

RUN_MODEL = re.compile(r"^(r-[0-9a-f]{8})(?:@step-(\d{1,9}))?$")
MAX_RUNS = 100  # /v1/models lists the newest runs with a sampler checkpoint...
MAX_STEPS_PER_RUN = 50  # ...each with its newest steps; older ones still answer by id
OWNER = "rlcs"


@dataclass(frozen=True)
class Target:
    """What a model id names: the base model, the adapter on it (if any), the backend."""

    model_id: str
    model: str
    adapter: str | None
    backend: str


class ChatModels:
    def __init__(
        self,
        engine: Engine,
        configs: ConfigService,
        inference: InferenceService,
        models: ModelCheck,
        clock: Callable[[], float] = time.time,
        context: Callable[[str], int | None] = lambda name: None,
    ) -> None:
        self._engine = engine
        self._configs = configs
        self._inference = inference
        self._models = models
        self._started = int(clock())
        self._context = context  # a base model's context length (its config.json), if known

    def resolve(self, model_id: str) -> Target:
        match = RUN_MODEL.match(model_id)
        if match is not None:
            return self._run_target(model_id, match.group(1), match.group(2))
        for name, backend in self.base_models().items():
            if name == model_id:
                return Target(model_id, name, None, backend)
        raise not_found(model_id, "it is neither a base model here nor a run's checkpoint")

    def base_models(self) -> dict[str, str]:
        """Base model names and the backend serving each: the selected environment's model
        first, then the models that load offline on the local backend."""
        found: dict[str, str] = {}
        try:
            _, config = self._configs.resolve(self._configs.selected())
            found[config.model_name] = self._models.backend_for(config.backend)
        except DomainError:
            pass  # nothing selected, or its config does not import: no environment model
        for name in known_models():
            found.setdefault(name, "local")
        return found

    def _run_target(self, model_id: str, run_id: str, step: str | None) -> Target:
        with read_session(self._engine) as session:
            run = session.get(Run, run_id)
        if run is None:
            raise not_found(model_id, f"there is no run {run_id}")
        try:
            path = self._inference.adapter(run_id, int(step) if step is not None else None)
        except (Conflict, NotFound) as exc:
            why = exc.detail.removeprefix("checkpoint_step: ")
            raise not_found(model_id, why[0].lower() + why[1:]) from None
        # Where the weights live says which backend trained them (an `auto` run's choice).
        backend = "tinker" if path.startswith("tinker://") else "local"
        return Target(model_id, base_model_of(run), path, backend)

    def listing(self) -> list[ModelOut]:
        """OpenAI's model objects: base models, then runs newest first (latest, then steps)."""
        contexts: dict[str, int | None] = {}

        def model(model_id: str, created: int, root: str, parent: str | None) -> ModelOut:
            if root not in contexts:
                contexts[root] = self._context(root)
            return ModelOut(
                id=model_id,
                created=created,
                owned_by=OWNER,
                root=root,
                parent=parent,
                max_model_len=contexts[root],
            )

        data = [model(name, self._started, name, None) for name in self.base_models()]
        runs, rows = self._sampled_runs()
        for run in runs:
            base = base_model_of(run)
            steps: dict[int, Checkpoint] = {}
            for row in rows:
                if row.run_id == run.id and row.step not in steps:
                    steps[row.step] = row
            if not steps:
                continue
            latest = next(iter(steps.values()))
            data.append(model(run.id, _epoch(latest), base, None))
            for step, row in list(steps.items())[:MAX_STEPS_PER_RUN]:
                data.append(model(f"{run.id}@step-{step}", _epoch(row), base, run.id))
        return data

    def _sampled_runs(self) -> tuple[Sequence[Run], Sequence[Checkpoint]]:
        """The newest runs (MAX_RUNS) that saved a sampler checkpoint, and their sampler
        checkpoints, newest first."""
        with read_session(self._engine) as session:
            with_samplers = select(Checkpoint.run_id).where(Checkpoint.kind == "sampler")
            runs = session.exec(
                select(Run)
                .where(col(Run.id).in_(with_samplers))
                .order_by(col(Run.created_at).desc(), col(Run.id).desc())
                .limit(MAX_RUNS)
            ).all()
            rows = session.exec(
                select(Checkpoint)
                .where(
                    col(Checkpoint.run_id).in_([r.id for r in runs]),
                    Checkpoint.kind == "sampler",
                )
                .order_by(col(Checkpoint.step).desc(), col(Checkpoint.id).desc())
            ).all()
        return runs, rows


def base_model_of(run: Run) -> str:
    return str(json.loads(run.config_json).get("model_name", ""))


def not_found(model_id: str, why: str) -> NotFound:
    return NotFound(
        f"The model '{model_id[:80]}' does not exist here: {why}. A model is a base model, a "
        "run id (r-3f9c2a1b, its latest checkpoint) or a run at a step (r-3f9c2a1b@step-10); "
        "GET /v1/models lists them.",
        param="model",
        code="model_not_found",
    )


def _epoch(row: Checkpoint) -> int:
    created = row.created_at
    if created.tzinfo is None:  # SQLite gives back naive datetimes (stored as UTC)
        created = created.replace(tzinfo=UTC)
    return int(created.timestamp())
