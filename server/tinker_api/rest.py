"""The RestClient's views of Tinker sessions' models (its "training runs") and checkpoints,
read from the runs in our database, and deleting a checkpoint."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.models import Checkpoint, Run, iso
from server.errors import BadRequest, NotFound
from server.tinker_api import paths
from server.tinker_api.schemas import JsonObject
from server.tinker_api.sessions.records import SessionRecords
from server.tinker_api.sizes import folder_bytes

MAX_RUNS = 1000  # sessions read to list models; older ones are not listed


class TinkerRest:
    def __init__(self, records: SessionRecords) -> None:
        self._records = records

    def training_runs(self, limit: int, offset: int) -> JsonObject:
        runs, _ = self._records.runs(MAX_RUNS, 0)
        models = [(run, model) for run in runs for model in _models(run).values()]
        rows = self._records.checkpoints([run.id for run in runs])
        page = [self._training_run(run, model, rows) for run, model in models]
        return {
            "training_runs": page[offset : offset + limit],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(page)},
        }

    def training_run(self, model_id: str) -> JsonObject:
        run, model = self._find(model_id)
        return self._training_run(run, model, self._records.checkpoints([run.id]))

    def checkpoints(self, model_id: str) -> JsonObject:
        run, model = self._find(model_id)
        rows = self._records.checkpoints([run.id])
        return {"checkpoints": [c for c in _views(run.id, rows) if _of(c, model)]}

    def user_checkpoints(self, limit: int, offset: int) -> JsonObject:
        views = []
        for row in self._records.checkpoints():
            views.extend(_views(row.run_id, [row]))
        return {
            "checkpoints": views[offset : offset + limit],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(views)},
        }

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> None:
        run, _ = self._find(model_id)
        ref = _ref(f"{paths.PREFIX}{model_id}/{checkpoint_id}", "checkpoint_id")
        folder = ref.folder(Path(run.run_dir))
        if not folder.is_dir():
            raise NotFound(f"checkpoint_id: {model_id} has no checkpoint {checkpoint_id}")
        shutil.rmtree(folder)
        if not any(folder.parent.iterdir()):
            folder.parent.rmdir()
        self._records.forget_checkpoint(run.id, str(folder))

    def weights_info(self, tinker_path: str) -> JsonObject:
        ref = _ref(tinker_path, "tinker_path")
        run = self._records.run(ref.session_id)
        folder = ref.folder(Path(run.run_dir)) if run is not None else None
        try:
            assert folder is not None
            record = json.loads((folder / ref.record_file).read_text())
        except (AssertionError, OSError, ValueError):
            raise NotFound(f"tinker_path: no checkpoint at {tinker_path}") from None
        lora = record.get("lora") or {}
        return {
            "base_model": record.get("base_model"),
            "is_lora": True,
            "lora_rank": lora.get("rank"),
            "train_unembed": lora.get("train_unembed"),
            "train_mlp": lora.get("train_mlp"),
            "train_attn": lora.get("train_attn"),
        }

    def _find(self, model_id: str) -> tuple[Run, dict[str, Any]]:
        owner = paths.parse_model_id(model_id)
        run = self._records.run(owner[0]) if owner is not None else None
        model = _models(run).get(str(owner[1])) if run is not None and owner else None
        if run is None or model is None:
            raise NotFound(f"training_run_id: no training run {model_id[:100]} here")
        return run, model

    def _training_run(self, run: Run, model: dict[str, Any], rows: list[Checkpoint]) -> JsonObject:
        views = [c for c in _views(run.id, rows) if _of(c, model)]
        last = {
            kind: next((c for c in views if c["checkpoint_type"] == kind), None)
            for kind in ("training", "sampler")
        }
        when = run.last_step_at or run.started_at or run.created_at
        return {
            "training_run_id": model["model_id"],
            "base_model": model["base_model"],
            "model_owner": "local",
            "is_lora": True,
            "corrupted": False,
            "lora_rank": model.get("lora_rank"),
            "last_request_time": iso(when),
            "last_checkpoint": last["training"],
            "last_sampler_checkpoint": last["sampler"],
            "user_metadata": _strings(model.get("user_metadata")),
        }


def _models(run: Run) -> dict[str, dict[str, Any]]:
    try:
        models = json.loads(run.config_json).get("models") or {}
    except (ValueError, AttributeError):
        return {}
    return models if isinstance(models, dict) else {}


def _views(run_id: str, rows: list[Checkpoint]) -> list[JsonObject]:
    """Checkpoint rows as the RestClient's Checkpoint objects, newest first."""
    views = []
    for row in sorted(rows, key=lambda r: _time(r.created_at), reverse=True):
        ref = paths.from_folder(run_id, row.path)
        if ref is None:
            continue
        views.append(
            {
                "checkpoint_id": ref.checkpoint_id,
                "checkpoint_type": paths.CHECKPOINT_TYPES[ref.kind],
                "time": iso(row.created_at),
                "tinker_path": ref.path,
                "size_bytes": folder_bytes(Path(row.path)),
                "public": row.public,
                "user_metadata": None,
                "expires_at": iso(row.expires_at) if row.expires_at else None,
                "model_id": ref.model_id,
            }
        )
    return views


def _of(view: JsonObject, model: dict[str, Any]) -> bool:
    return bool(view["model_id"] == model.get("model_id"))


def _ref(path: str, field: str) -> paths.CheckpointRef:
    try:
        return paths.parse(path, field)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def _time(value: datetime) -> float:
    # SQLite gives back naive datetimes (stored as UTC).
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def _strings(values: Any) -> dict[str, str] | None:
    if not isinstance(values, dict):
        return None
    return {str(k): str(v) for k, v in values.items()}
