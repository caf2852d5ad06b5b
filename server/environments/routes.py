"""Environment listing, selection, and per-environment and selected config."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path

from server.deps import Services, services
from server.environments.catalog import NAME_MAX, NAME_PATTERN
from server.environments.schemas import (
    ConfigEditIn,
    ConfigOut,
    ConfigPutIn,
    EnvironmentOut,
    SelectOut,
)

router = APIRouter(tags=["environments"])
Svc = Annotated[Services, Depends(services)]
EnvName = Annotated[
    str,
    Path(
        pattern=NAME_PATTERN.pattern,
        max_length=NAME_MAX,
        description="An environment name from GET /environments",
    ),
]


@router.get("/environments", response_model=list[EnvironmentOut])
def list_environments(svc: Svc) -> list[dict[str, Any]]:
    return [{k: getattr(e, k) for k in EnvironmentOut.model_fields} for e in svc.catalog.list()]


@router.post("/environments/{name}/select", response_model=SelectOut)
def select_environment(name: EnvName, svc: Svc) -> dict[str, Any]:
    return svc.configs.select(name)


@router.get("/environments/{name}/config", response_model=ConfigOut)
def get_environment_config(name: EnvName, svc: Svc) -> dict[str, Any]:
    return svc.configs.view(name)


@router.put("/environments/{name}/config", response_model=ConfigOut)
def put_environment_config(name: EnvName, body: ConfigPutIn, svc: Svc) -> dict[str, Any]:
    return svc.configs.set_fields(name, body.values)


@router.get("/config", response_model=ConfigOut)
def get_config(svc: Svc) -> dict[str, Any]:
    return svc.configs.view(svc.configs.selected())


@router.post("/config", response_model=ConfigOut)
def edit_config(body: ConfigEditIn, svc: Svc) -> dict[str, Any]:
    return svc.configs.set_fields(svc.configs.selected(), {body.field: body.value})
