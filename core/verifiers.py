"""What the server and the runner agree on about verifiers environments (docs/verifiers.md): the
training fields such a run adds to the environment's own arguments, and where the scripts that
run in the verifiers interpreter live. Torch-free and verifiers-free: verifiers lives in its own
interpreter (`make install` makes .venv-verifiers).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from core.settings import PROJECT_ROOT
from core.training_config import TrainingConfig

ENVSIDE_DIR = PROJECT_ROOT / "runners" / "verifiers" / "envside"
INSPECT_SCRIPT = ENVSIDE_DIR / "inspect_env.py"
DRIVE_SCRIPT = ENVSIDE_DIR / "drive.py"
KEY_VARIABLE = "RLCS_FACE_KEY"  # the face's key, as the driver's verifiers client reads it

# v0: `load_environment(**args) -> vf.Environment` (verifiers <= 0.3); v1: a `Taskset` and an
# `Env` (`import verifiers.v1`).
Generation = Literal["v0", "v1"]
V0_ENTRY = "load_environment"


class VerifiersTrainingConfig(TrainingConfig):
    """The training half of a verifiers run's config: model, LoRA, optimizer, loss, sampling,
    W&B, resources, and the shape of a step (groups of rollouts of one example each)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    LOCKED: ClassVar[frozenset[str]] = TrainingConfig.LOCKED
    SEQUENCE_IDS: ClassVar[bool] = False  # its rollouts carry none

    total_steps: int = Field(20, ge=1, le=1_000_000, description="Training steps")
    group_size: int = Field(
        4, ge=1, le=256, description="Rollouts of one example scored together (a group)"
    )
    groups_per_step: int = Field(
        2, ge=1, le=4096, description="Groups (dataset examples) a training step plays"
    )
    max_tokens: int = Field(
        256, ge=1, le=1_048_576, description="Most tokens the model writes per turn"
    )


TRAINING_FIELDS = frozenset(VerifiersTrainingConfig.model_fields)
# What the server fixes on every role of a v1 environment (shown locked), and why.
V1_LOCKED = {
    "runtime": "subprocess: every role runs on this machine (Prime's remote sandboxes, verifiers' "
    "default, are out of this server's reach)",
    "harness": "null, a plain chat loop: verifiers' default (bash) runs code and calls tools, "
    "which need a sandbox and a tool format",
}
# An argument of the environment's that has the name of one of our training fields (a `seed`,
# a `max_tokens`) is shown and edited under this prefix; the environment gets its own name.
ENV_PREFIX = "env."


def config_name(arg: str) -> str:
    """The config field an environment argument is edited as."""
    return f"{ENV_PREFIX}{arg}" if arg in TRAINING_FIELDS else arg


def arg_name(field: str) -> str:
    """The environment argument a config field (not one of ours) stands for."""
    return field.removeprefix(ENV_PREFIX)


class VerifiersRunConfig(VerifiersTrainingConfig):
    """A verifiers run's whole config, as frozen: the training fields, typed, and the
    environment's own arguments as its inspector validated them (extra)."""

    model_config = ConfigDict(extra="allow", validate_assignment=False)

    @property
    def environments(self) -> dict[str, Any]:
        """No multi-environment mixes: a verifiers run trains its one environment."""
        return {}

    def env_args(self) -> dict[str, Any]:
        """The environment's own arguments (`load_environment(**args)`)."""
        extra = self.model_extra or {}
        return {arg_name(k): v for k, v in extra.items() if k not in V1_LOCKED}
