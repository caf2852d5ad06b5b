"""The models a run's config names besides its own (`kl_reference`, `teacher`), checked before the
run exists: a run reference must name a sampler checkpoint that exists, on a base this run can
use, where this run's backend can load it; a teacher's model name must be one the backend can
sample. A reference to a run's newest checkpoint is pinned to its step in the frozen config.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from core import checkpoint_refs
from core.checkpoint_check import is_remote
from core.db import read_session
from core.models import Checkpoint, Run
from server.environments.configs import ConfigService
from server.errors import InvalidValue


class References:
    def __init__(self, engine: Engine, configs: ConfigService) -> None:
        self._engine = engine
        self._configs = configs

    def pins(self, values: dict[str, Any]) -> dict[str, str]:
        """The run references of `values` (a resolved config) checked and pinned to a step, by
        field; InvalidValue naming the field when one does not fit."""
        out: dict[str, str] = {}
        reference = values.get("kl_reference")
        if reference is not None and reference != checkpoint_refs.BASE:
            out["kl_reference"] = self._checkpoint(values, "kl_reference", reference, True)
        teacher = values.get("teacher")
        if teacher is not None:
            if checkpoint_refs.parse(teacher) is not None:
                out["teacher"] = self._checkpoint(values, "teacher", teacher, False)
            else:
                self._configs.check_model_name(teacher, values["backend"], "teacher", "sample")
        return out

    def _checkpoint(
        self, values: dict[str, Any], field: str, reference: str, same_base: bool
    ) -> str:
        """The reference pinned to its step, once its run and checkpoint are known to fit."""
        parsed = checkpoint_refs.parse(reference)
        assert parsed is not None  # the config's own validation checked the form
        run_id, step = parsed
        run, found = self._sampler_checkpoint(field, run_id, step)
        base = str(json.loads(run.config_json).get("model_name", ""))
        model = str(values.get("model_name"))
        if same_base and base != model:
            raise InvalidValue(
                f"field '{field}': {reference} is an adapter on {base}, not on this run's model "
                f"{model}; a KL reference must share the run's base model (or use 'base')."
            )
        backend = self._configs.backend_of(str(values.get("backend")))
        remote = is_remote(found.path)
        if remote != (backend == "tinker"):
            where = "on Tinker" if remote else "on this machine"
            raise InvalidValue(
                f"field '{field}': {reference} was saved {where}, and this run trains on the "
                f"{backend} backend, which cannot load it; name a checkpoint of a {backend} run."
            )
        if not same_base:
            self._configs.check_model_name(base, values["backend"], field, "sample")
        return checkpoint_refs.pinned(run_id, found.step)

    def _sampler_checkpoint(
        self, field: str, run_id: str, step: int | None
    ) -> tuple[Run, Checkpoint]:
        """The run a reference names and its sampler checkpoint at `step` (default: its
        newest); InvalidValue naming the field and what there is when either is missing."""
        with read_session(self._engine) as session:
            run = session.get(Run, run_id)
            rows = session.exec(
                select(Checkpoint)
                .where(Checkpoint.run_id == run_id, Checkpoint.kind == "sampler")
                .order_by(col(Checkpoint.step).desc(), col(Checkpoint.id).desc())
            ).all()
        if run is None:
            raise InvalidValue(
                f"field '{field}': there is no run {run_id} (GET /runs lists them; a "
                f"reference is {checkpoint_refs.FORMS})."
            )
        found = next((r for r in rows if step is None or r.step == step), None)
        if found is None:
            have = ", ".join(str(s) for s in sorted({r.step for r in rows})) or "none yet"
            raise InvalidValue(
                f"field '{field}': run {run_id} has no sampler checkpoint"
                + (f" at step {step}" if step is not None else "")
                + f" (its sampler checkpoints: steps {have}); name one of those, or wait for "
                "one (a run saves one every save_every steps and when it ends)."
            )
        return run, found
