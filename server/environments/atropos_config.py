"""The config of an Atropos environment as the user sees it: the environment's own fields (from
its `config_init()`, read by the Atropos inspector) and our training fields
(core.atropos.AtroposTrainingConfig), with the fields the server decides shown locked.

Training fields are validated here (they are ours); the environment's by its own config class,
in its inspector. The environment fields the training config also has (tokenizer_name,
use_wandb, wandb_name) are ours to edit; the environment gets values derived from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.atropos import (
    LOCKED_ENV_FIELDS,
    SHADOWED_FIELDS,
    AtroposTrainingConfig,
    locked_env_values,
)
from core.inspect_wire import Described
from server.environments import two_owners
from server.environments.inspector import Ask, ConfigSchema, InspectFailed

TRAINING_FIELDS = frozenset(AtroposTrainingConfig.model_fields)
# Training fields whose default the environment's config_init() gives, when it sets one.
SEEDED_FROM_ENV = ("use_wandb", "wandb_name")

LOCKED_REASONS = {
    "tokenizer_name": "the server derives it from model_name and hands the environment the "
    "tokenizer as a local folder",
    "rollout_server_url": "each run starts its own trajectory API on a loopback port",
    "batch_size": "it is groups_per_step x group_size (edit those)",
    "max_batches_offpolicy": "the server keeps the environment max_steps_off_policy batches "
    "ahead of the policy it trains (at least one)",
    "data_path_to_save_groups": "the runner reads the groups from the trajectory API",
    "data_dir_to_save_evals": "evaluations are written into the run's folder",
    "openai": "the environment samples from the run's own policy, served on a loopback port "
    "with a key made for the run",
}


@dataclass
class AtroposConfigSchema(ConfigSchema):
    """An Atropos environment's config: its fields and ours, validated each by its owner."""

    env_fields: frozenset[str] = field(default_factory=frozenset)
    env_defaults: dict[str, Any] = field(default_factory=dict)
    servers: dict[str, Any] = field(default_factory=dict)

    def validate(self, values: dict[str, Any]) -> dict[str, Any]:
        wanted = {k: v for k, v in values.items() if k not in self.locked}
        seeded = {k: self.env_defaults[k] for k in SEEDED_FROM_ENV if k in self.env_defaults}
        training = {**seeded, **{k: v for k, v in wanted.items() if k in TRAINING_FIELDS}}
        env = {k: v for k, v in wanted.items() if k not in TRAINING_FIELDS}
        trained, theirs = two_owners.validate_by_owners(
            AtroposTrainingConfig, training, self._ask, env
        )
        # Training fields first, as for ours; the environment's own after them.
        out = trained.model_dump(mode="json")
        out.update({k: v for k, v in theirs.items() if k not in out})
        out.update(
            locked_env_values(
                int(out["group_size"]), trained.groups_per_step, trained.max_steps_off_policy
            )
        )
        return out

    def locked_reason(self, name: str) -> str:
        return LOCKED_REASONS.get(name, super().locked_reason(name))


def describe_atropos(first: Described, ask: Ask) -> ConfigSchema:
    """The Atropos inspector's first answer as the config the user sees."""
    env_fields = frozenset(first.fields)
    if "group_size" not in env_fields or "total_steps" not in env_fields:
        raise InspectFailed("its config_init() config lacks group_size or total_steps")
    return AtroposConfigSchema(
        fields=env_fields | TRAINING_FIELDS | LOCKED_ENV_FIELDS,
        locked=LOCKED_ENV_FIELDS | AtroposTrainingConfig.locked_fields(),
        schema=merged_schema(first.config_schema),
        defaults=two_owners.training_defaults(AtroposTrainingConfig),
        _ask=ask,
        framework="atropos",
        env_fields=env_fields,
        env_defaults=dict(first.defaults),
        servers=dict(first.servers or {}),
    )


def merged_schema(env_schema: dict[str, Any]) -> dict[str, Any]:
    """One JSON schema: our training fields first, then the environment's own (its fields the
    training config also has are described by ours)."""
    return two_owners.merged_schema(
        AtroposTrainingConfig,
        env_schema,
        env_schema.get("title", "AtroposEnvConfig"),
        "An Atropos environment's config, with the training fields of the run",
        lambda name: None if name in SHADOWED_FIELDS else name,
    )
