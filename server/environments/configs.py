"""Per-environment config: defaults from the class, edits stored and versioned, validation.

Only the fields a user edited are stored, so a later change of a class default still applies
to fields nobody touched. Edits are validated strictly (JSON types, no coercion from strings)
by the environment's own Config, in its inspector process (environment code never runs here).
A config that names no model gets the default model of the backend that will run it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ConfigDict, ValidationError
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core.atropos import AtroposRunConfig
from core.db import read_session, write_session
from core.frameworks import FRAMEWORKS, Framework, load
from core.model_names import LOCAL_DEFAULT_MODEL, default_model
from core.models import EnvironmentConfig, Selection, iso, utcnow
from core.spec import EnvSource
from core.verifiers import VerifiersRunConfig
from environments.base import EnvConfig, MixEntry
from server.environments.catalog import Catalog, EnvEntry
from server.environments.inspector import (
    CannotStart,
    ConfigInvalid,
    ConfigSchema,
    InspectFailed,
)
from server.environments.model_check import ModelCheck
from server.environments.schemas import ConfigOut, SelectOut
from server.errors import BadRequest, Conflict, DomainError, InvalidValue


class ResolvedConfig(EnvConfig):
    """An environment's whole config as its own class validated it: the fields every
    environment has, typed for the server's use, and the environment's own fields as they are."""

    model_config = ConfigDict(extra="allow", validate_assignment=False)


# What a framework's whole config validates as: its run config, or ours.
Resolved = ResolvedConfig | AtroposRunConfig | VerifiersRunConfig


def resolved_config(framework: Framework) -> type[Resolved]:
    """The class a framework's whole config validates as (FRAMEWORKS' run config, or ours)."""
    run_config = FRAMEWORKS[framework].run_config
    return ResolvedConfig if run_config is None else load(run_config)


class ConfigService:
    def __init__(self, engine: Engine, catalog: Catalog, models: ModelCheck) -> None:
        self._engine = engine
        self._catalog = catalog
        self._models = models

    # Selection -------------------------------------------------------------------------

    def select(self, name: str) -> SelectOut:
        entry, _ = self._catalog.load(name)
        with write_session(self._engine) as session:
            row = session.get(Selection, 1)
            if row is None:
                session.add(Selection(id=1, environment=entry.name))
            else:
                row.environment, row.selected_at = entry.name, utcnow()
                session.add(row)
        view = self.view(entry.name)
        return SelectOut(
            selected=entry.name,
            file_path=entry.file_path,
            class_name=entry.class_name,
            description=entry.description,
            framework=entry.framework,
            config=view.configurable_fields,
        )

    def selected(self) -> str:
        with read_session(self._engine) as session:
            row = session.get(Selection, 1)
        if row is None:
            raise BadRequest(
                "No environment is selected: select one first with "
                "POST /environments/{name}/select (GET /environments lists them)."
            )
        return row.environment

    # Reading ---------------------------------------------------------------------------

    def view(self, name: str) -> ConfigOut:
        entry, config_schema = self._config_class(name)
        with read_session(self._engine) as session:
            stored, version, updated_at = _stored(session, entry.name)
        values = _build(config_schema, self._with_model_default(config_schema, stored))
        locked = config_schema.locked
        schema = json.loads(json.dumps(config_schema.schema))  # a copy: the cached one stays whole
        for field in locked:
            schema.get("properties", {}).pop(field, None)
        return ConfigOut(
            environment=entry.name,
            configurable_fields={k: v for k, v in values.items() if k not in locked},
            locked_fields={k: v for k, v in values.items() if k in locked},
            schema_=schema,
            version=version,
            updated_at=iso(updated_at),
        )

    def resolve(
        self, name: str, overrides: dict[str, Any] | None = None
    ) -> tuple[EnvEntry, Resolved]:
        """Defaults + stored edits + overrides, validated as a whole (for starting a run)."""
        entry, config_schema = self._config_class(name)
        with read_session(self._engine) as session:
            stored, _, _ = _stored(session, entry.name)
        return self.revalidate(entry.name, _known(config_schema, stored), overrides or {})

    def revalidate(
        self, name: str, base: dict[str, Any], overrides: dict[str, Any]
    ) -> tuple[EnvEntry, Resolved]:
        """`base` (e.g. a run's frozen config) with `overrides`, validated as a whole."""
        entry, config_schema = self._config_class(name)
        _check_fields(config_schema, overrides, InvalidValue)
        config = self._validated(config_schema, {**base, **overrides})
        self.check_mix(config)
        return entry, config

    def check_starts(self, name: str, config: Resolved) -> None:
        """422 when a run of `config` could not start: the environment does not load with
        it (verifiers environments are tried in their inspector; the others load in the run)."""
        _, config_schema = self._config_class(name)
        try:
            config_schema.check_starts(config.model_dump(mode="json"))
        except CannotStart as exc:
            raise InvalidValue(
                f"Environment '{name}' cannot start with this config: {exc}."
            ) from None
        except ConfigInvalid as exc:
            raise InvalidValue(describe_errors(exc.errors)) from None
        except InspectFailed as exc:
            raise Conflict(f"The environment could not be tried: {exc}.") from None

    def check_model(self, config: Resolved | EnvConfig, purpose: str = "train") -> None:
        """422 when the backend that will run `config` cannot serve its model (or its rank)."""
        self._models.check(config.model_name, config.backend, "model_name", purpose)
        if purpose == "train":
            self._models.check_rank(config.lora_rank, config.backend)
            self._models.check_fits(config.model_name, config.backend, config.engine)
            self._models.check_hosts(
                config.sample_hosts, config.num_devices, config.backend, config.engine
            )

    def check_model_name(self, model: str, backend: str, field: str, purpose: str) -> None:
        """422 naming `field` when `backend` cannot serve `model` (a teacher, say)."""
        self._models.check(model, backend, field, purpose)

    def backend_of(self, backend: str) -> str:
        """The backend a config's `backend` (auto, local, tinker) resolves to here."""
        return self._models.backend_for(backend)

    def _validated(self, config_schema: ConfigSchema, values: dict[str, Any]) -> Resolved:
        chosen = _with_loss_default(config_schema, self._with_model_default(config_schema, values))
        return _validate(config_schema, chosen)

    def _with_model_default(
        self, config_schema: ConfigSchema, values: dict[str, Any]
    ) -> dict[str, Any]:
        """Name the backend's default model when neither the user nor the class chose one."""
        if "model_name" in values or config_schema.defaults["model_name"] != LOCAL_DEFAULT_MODEL:
            return values
        backend = values.get("backend", config_schema.defaults["backend"])
        if not isinstance(backend, str):
            return values  # validation reports the bad backend
        return {**values, "model_name": default_model(self._models.backend_for(backend))}

    def check_mix(self, config: Resolved) -> None:
        """Every environment named in a multi-environment mix must exist and import (and be
        one of ours: Atropos and verifiers environments run in processes of their own)."""
        for name in config.environments:
            try:
                entry, _ = self._catalog.load(name)
            except DomainError as exc:
                raise InvalidValue(f"field 'environments': {exc.detail}") from None
            if entry.framework != "rlcs":
                raise InvalidValue(
                    f"field 'environments': '{name}' is {FRAMEWORKS[entry.framework].label} "
                    "environment; it trains in a run of its own and cannot be mixed into another "
                    "environment's run."
                )

    def mix(self, name: str, config: Resolved) -> dict[str, EnvSource]:
        """The frozen sources of a run: each environment's class, file, config and share."""
        entries = {name: MixEntry(), **config.environments}
        sources: dict[str, EnvSource] = {}
        for env_name, share in entries.items():
            if env_name == name:
                entry, env_config = self._catalog.load(name)[0], config
            else:
                entry, env_config = self.resolve(env_name)
            values = env_config.model_dump(mode="json")
            if share.num_rollouts:
                values["group_size"] = share.num_rollouts
            sources[entry.name] = entry.source(values, share.weight)
        return sources

    # Editing ---------------------------------------------------------------------------

    def set_fields(self, name: str, changes: dict[str, Any]) -> ConfigOut:
        """Validate `changes` against the whole config and store them as a new version."""
        entry, config_schema = self._config_class(name)
        if not changes:
            raise InvalidValue("values: give at least one field to change.")
        _check_fields(config_schema, changes, BadRequest)
        # Imports (mix) and questions to the backend (model) happen before the write
        # transaction, which holds SQLite's write lock.
        with read_session(self._engine) as session:
            stored, _, _ = _stored(session, entry.name)
        config = self._validated(config_schema, {**_known(config_schema, stored), **changes})
        self.check_mix(config)
        if {"model_name", "backend"} & set(changes):
            self.check_model(config)
        with write_session(self._engine) as session:
            stored, version, _ = _stored(session, entry.name)
            merged = {**_known(config_schema, stored), **changes}
            self._validated(config_schema, merged)  # against an edit stored meanwhile
            session.add(
                EnvironmentConfig(
                    environment=entry.name, version=version + 1, values_json=json.dumps(merged)
                )
            )
        return self.view(entry.name)

    def _config_class(self, name: str) -> tuple[EnvEntry, ConfigSchema]:
        return self._catalog.load(name)


def _stored(session: Session, env: str) -> tuple[dict[str, Any], int, Any]:
    row = session.exec(
        select(EnvironmentConfig)
        .where(EnvironmentConfig.environment == env)
        .order_by(col(EnvironmentConfig.version).desc())
        .limit(1)
    ).first()
    if row is None:
        return {}, 0, None
    return json.loads(row.values_json), row.version, row.updated_at


def _known(config_schema: ConfigSchema, stored: dict[str, Any]) -> dict[str, Any]:
    # A field removed from the class since it was stored is ignored rather than fatal.
    return {k: v for k, v in stored.items() if k in config_schema.fields}


def _build(config_schema: ConfigSchema, stored: dict[str, Any]) -> dict[str, Any]:
    try:
        return _check(config_schema, _known(config_schema, stored))
    except ConfigInvalid:
        # Stored edits no longer valid under a changed class: show the defaults' view plus
        # whatever still validates field by field.
        good = {}
        for key, value in _known(config_schema, stored).items():
            try:
                _check(config_schema, {key: value})
                good[key] = value
            except ConfigInvalid:
                pass
        return _check(config_schema, good)


def _check(config_schema: ConfigSchema, values: dict[str, Any]) -> dict[str, Any]:
    """The class's validation in its inspector; a failure of the inspector itself is a 409."""
    try:
        return config_schema.validate(values)
    except InspectFailed as exc:
        raise Conflict(f"The environment's Config could not be checked: {exc}.") from None


def _check_fields(
    config_schema: ConfigSchema, changes: dict[str, Any], error: type[BadRequest | InvalidValue]
) -> None:
    fields = config_schema.fields
    locked = config_schema.locked
    editable = sorted(f for f in fields if f not in locked)
    for key in changes:
        if key in locked:
            raise error(
                f"field '{key}' is locked: {config_schema.locked_reason(key)}; it cannot be edited."
            )
        if key not in fields:
            raise error(
                f"field '{key}' does not exist for this environment. Editable fields: "
                f"{', '.join(editable)}."
            )


def _validate(config_schema: ConfigSchema, values: dict[str, Any]) -> Resolved:
    try:
        dumped = _check(config_schema, values)
    except ConfigInvalid as exc:
        raise InvalidValue(describe_errors(exc.errors)) from None
    resolved = resolved_config(config_schema.framework)
    try:
        return resolved.model_validate(dumped)
    except ValidationError as exc:
        # The class loosened a field the server relies on beyond the base bounds.
        raise InvalidValue(
            describe_errors(exc.errors(include_url=False))
            + " (the environment's Config allows this value; the server does not)"
        ) from None


def describe_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        got = f" (got {json.dumps(err['input'], default=str)[:60]})" if "input" in err else ""
        if not err["loc"]:
            got = ""
        message = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"field '{loc}': {message}{got}")
    return "; ".join(parts) + "."


def _with_loss_default(config_schema: ConfigSchema, values: dict[str, Any]) -> dict[str, Any]:
    """A run that samples ahead (max_steps_off_policy of 1 or more) and chose no loss trains
    with stable_reinforce, as tinker-cookbook's async runs do, where its driver can feed it
    (the environment's schema offers it) and it samples on its trainer's host alone (the
    sequences it reads are recorded there); the others keep the class's default."""
    ahead = values.get("max_steps_off_policy")
    if "loss_fn" in values or not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 1:
        return values
    if values.get("sample_hosts", 1) != 1:
        return values
    field = config_schema.schema.get("properties", {}).get("loss_fn", {})
    if field.get("default") != "importance_sampling":
        return values  # the class chose its own default
    if "stable_reinforce" not in field.get("enum", []):
        return values
    return {**values, "loss_fn": "stable_reinforce"}
