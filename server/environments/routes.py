"""Environment listing, selection, and per-environment and selected config."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path

from server.environments.catalog import NAME_MAX, NAME_PATTERN, Catalog
from server.environments.configs import ConfigService
from server.environments.deps import catalog, config_service
from server.environments.schemas import (
    ConfigEditIn,
    ConfigOut,
    ConfigPutIn,
    EnvironmentOut,
    SelectOut,
)

router = APIRouter(tags=["environments"])
Environments = Annotated[Catalog, Depends(catalog)]
Configs = Annotated[ConfigService, Depends(config_service)]
EnvName = Annotated[
    str,
    Path(
        pattern=NAME_PATTERN.pattern,
        max_length=NAME_MAX,
        description="An environment name from GET /environments",
    ),
]


@router.get("/environments")
def list_environments(environments: Environments) -> list[EnvironmentOut]:
    return environments.listing()


@router.post("/environments/{name}/select")
def select_environment(name: EnvName, configs: Configs) -> SelectOut:
    return configs.select(name)


@router.get("/environments/{name}/config")
def get_environment_config(name: EnvName, configs: Configs) -> ConfigOut:
    return configs.view(name)


@router.put("/environments/{name}/config")
def put_environment_config(name: EnvName, body: ConfigPutIn, configs: Configs) -> ConfigOut:
    return configs.set_fields(name, body.values)


@router.get("/config")
def get_config(configs: Configs) -> ConfigOut:
    return configs.view(configs.selected())


@router.post("/config")
def edit_config(body: ConfigEditIn, configs: Configs) -> ConfigOut:
    return configs.set_fields(configs.selected(), {body.field: body.value})
