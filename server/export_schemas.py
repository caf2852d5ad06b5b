"""Request and answer bodies of POST /runs/{id}/export."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ExportIn(BaseModel):
    """Which checkpoint (default: the newest sampler checkpoint), whether to merge the adapter
    into the base model, and where to write (default: the run's folder, `export/step-N`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"checkpoint_step": 20, "merged": True, "path": "mine"}]},
    )

    checkpoint_step: int | None = Field(
        None, ge=0, le=1_000_000, description="Export the sampler checkpoint at this step"
    )
    merged: bool = Field(False, description="Write the base model with the adapter merged in")
    path: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="A folder inside the export folder (RLCS_EXPORT_DIR); relative names are "
        "taken inside it",
    )
    overwrite: bool = Field(False, description="Replace a destination that holds files")


class ExportOut(BaseModel):
    run_id: str
    step: int
    path: str
    files: list[str]
    merged: bool
    format: str | None = Field(
        None, description="peft-lora, hf-merged, or tinker-external (as Tinker writes it)"
    )
    base_model: str | None = None
