"""Export a run's checkpoint as a Hugging Face folder (adapter, or model merged)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path

from core.models import RUN_ID
from server.runs.deps import export_service
from server.runs.export import ExportService
from server.runs.schemas import ExportIn, ExportOut

router = APIRouter(tags=["runs"])
Export = Annotated[ExportService, Depends(export_service)]
RunId = Annotated[str, Path(pattern=RUN_ID.pattern, description="A run id such as r-3f9c2a1b")]


@router.post("/runs/{run_id}/export")
def export_run(run_id: RunId, export: Export, body: ExportIn | None = None) -> ExportOut:
    """Write the checkpoint's folder and answer where; it takes seconds (a merge of a larger
    model, or a Tinker download, longer). A plain `def`: it runs on a worker thread."""
    body = body or ExportIn()
    return export.export(
        run_id,
        body.checkpoint_step,
        body.merged,
        body.path,
        body.overwrite,
        include_rollouts=body.include_rollouts,
    )
