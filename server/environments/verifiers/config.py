"""The config of a verifiers environment as the user sees it: the environment's own arguments
(v0: `load_environment`'s parameters, read by the verifiers inspector) beside our training
fields (core.verifiers.VerifiersTrainingConfig), each validated by its owner. An argument named
like one of our fields is edited as `env.<name>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.inspect_wire import Described, Failed, Invalid, Validated
from core.verifiers import (
    TRAINING_FIELDS,
    V1_LOCKED,
    VerifiersTrainingConfig,
    arg_name,
    config_name,
)
from server.environments import two_owners
from server.environments.inspector import (
    Ask,
    CannotStart,
    ConfigInvalid,
    ConfigSchema,
    InspectFailed,
)


@dataclass
class VerifiersConfigSchema(ConfigSchema):
    """A verifiers environment's config: its arguments and our fields."""

    env_fields: frozenset[str] = field(default_factory=frozenset)  # as the config names them

    def validate(self, values: dict[str, Any]) -> dict[str, Any]:
        wanted = {k: v for k, v in values.items() if k not in self.locked}
        training = {k: v for k, v in wanted.items() if k in TRAINING_FIELDS}
        args = {arg_name(k): v for k, v in wanted.items() if k not in TRAINING_FIELDS}
        trained, theirs = two_owners.validate_by_owners(
            VerifiersTrainingConfig, training, self._ask, args, _renamed
        )
        out = trained.model_dump(mode="json")
        out.update({config_name(k): v for k, v in theirs.items()})
        return out

    def locked_reason(self, name: str) -> str:
        return V1_LOCKED.get(name) or super().locked_reason(name)

    def check_starts(self, values: dict[str, Any]) -> None:
        """The environment loaded with the run's arguments in its inspector, as the run's
        driver will load it: what fails there (a dataset it would download, an API key it
        lacks, a remote sandbox) refuses the run now instead of failing it later."""
        args = {arg_name(k): v for k, v in values.items() if k in self.env_fields}
        match self._ask(args, load=True):
            case Validated():
                return
            case Failed(error=error):
                raise CannotStart(error)
            case Invalid(errors=invalid):
                raise ConfigInvalid([_renamed(e) for e in invalid])
            case other:
                raise InspectFailed(f"its inspector answered a load with {other.kind}")


def _renamed(error: dict[str, Any]) -> dict[str, Any]:
    loc = list(error.get("loc") or [])
    if loc and isinstance(loc[0], str):
        loc[0] = config_name(loc[0])
    return {**error, "loc": loc}


def describe_verifiers(first: Described, ask: Ask) -> ConfigSchema:
    """The verifiers inspector's first answer as the config the user sees."""
    env_fields = frozenset(config_name(f) for f in first.fields)
    fixed = frozenset(first.locked)  # v1: the runtime and harness of every role
    return VerifiersConfigSchema(
        fields=env_fields | TRAINING_FIELDS | fixed,
        locked=VerifiersTrainingConfig.locked_fields() | fixed,
        schema=merged_schema(first.config_schema),
        defaults=two_owners.training_defaults(VerifiersTrainingConfig),
        _ask=ask,
        framework="verifiers",
        env_fields=env_fields,
    )


def merged_schema(env_schema: dict[str, Any]) -> dict[str, Any]:
    """One JSON schema: our training fields first, then the environment's arguments."""
    return two_owners.merged_schema(
        VerifiersTrainingConfig,
        env_schema,
        "VerifiersEnvConfig",
        "A verifiers environment's arguments, with the training fields of the run",
        config_name,
    )
