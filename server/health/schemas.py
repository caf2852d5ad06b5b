"""Bodies of GET /health."""

from __future__ import annotations

from pydantic import BaseModel, Field

from server.launch.launcher import LauncherHealth


class HealthOut(BaseModel):
    status: str
    version: str
    backend: str
    environments: int
    active_runs: int
    supervisor: str = Field(
        description="'supervising', or 'standing by: <why>' when another server supervises"
    )
    launcher: LauncherHealth
