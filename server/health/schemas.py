"""Bodies of GET /health."""

from __future__ import annotations

from pydantic import (
    BaseModel,
    Field,
)


class LauncherOut(BaseModel):
    kind: str = Field(description="local (child processes) or ray (RLCS_LAUNCHER)")
    address: str | None = Field(description="The Ray job server (RLCS_RAY_ADDRESS)")
    reachable: bool
    reason: str | None = Field(description="Why the launcher cannot start runs now")


class HealthOut(BaseModel):
    status: str
    version: str
    backend: str
    environments: int
    active_runs: int
    supervisor: str = Field(
        description="'supervising', or 'standing by: <why>' when another server supervises"
    )
    launcher: LauncherOut
