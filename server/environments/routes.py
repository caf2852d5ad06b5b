"""Environment listing, selection, and per-environment and selected config."""

from __future__ import annotations

from typing import Annotated

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


@router.get("/environments")
def list_environments(svc: Svc) -> list[EnvironmentOut]:
    return svc.catalog.listing()


@router.post("/environments/{name}/select")
def select_environment(name: EnvName, svc: Svc) -> SelectOut:
    return svc.configs.select(name)


@router.get("/environments/{name}/config")
def get_environment_config(name: EnvName, svc: Svc) -> ConfigOut:
    return svc.configs.view(name)


@router.put("/environments/{name}/config")
def put_environment_config(name: EnvName, body: ConfigPutIn, svc: Svc) -> ConfigOut:
    return svc.configs.set_fields(name, body.values)


@router.get("/config")
def get_config(svc: Svc) -> ConfigOut:
    return svc.configs.view(svc.configs.selected())


@router.post("/config")
def edit_config(body: ConfigEditIn, svc: Svc) -> ConfigOut:
    return svc.configs.set_fields(svc.configs.selected(), {body.field: body.value})
