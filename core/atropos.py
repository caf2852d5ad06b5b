"""What the server and the runner agree on about Atropos environments (docs/atropos.md): the
training fields such a run adds to the environment's own config, the environment fields the
server decides (shown locked, as tinker-atropos locked them), and the process environment
Atropos code runs in. Torch-free and atroposlib-free: atroposlib lives in its own interpreter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import ConfigDict, Field

from core.settings import PROJECT_ROOT
from core.training_config import TrainingConfig

# Scripts that run in the Atropos interpreter (stdlib, pydantic and atroposlib only).
ENVSIDE_DIR = PROJECT_ROOT / "runners" / "atropos" / "envside"
INSPECT_SCRIPT = ENVSIDE_DIR / "inspect_env.py"
# On the PYTHONPATH of every Atropos process we start: its sitecustomize ends the process
# group when our process goes, and copies what the environment logs to W&B to a file.
HOOKS_DIR = ENVSIDE_DIR / "hooks"
METRICS_FILE_VARIABLE = "RLCS_ATROPOS_METRICS_FILE"
PARENT_VARIABLE = "RLCS_ATROPOS_PARENT_PID"

# An environment's W&B name and prefix: atroposlib needs a string (`desired_name`).
# max_batches_offpolicy: the environment samples the next batch while a step trains, so it
# runs at least one batch ahead; a run's max_steps_off_policy lets it run further.
OFFPOLICY_BATCHES = 1
PER_RUN = "<chosen when the run starts>"

# The environment's fields that the training config includes under the same name: the value
# shown and edited is ours; the environment gets one derived from it.
SHADOWED_FIELDS = frozenset({"tokenizer_name", "use_wandb", "wandb_name"})


def offpolicy_batches(max_steps_off_policy: int | None) -> int:
    """The environment's max_batches_offpolicy: the run's staleness bound, at least one."""
    return max(OFFPOLICY_BATCHES, max_steps_off_policy or 0)


def locked_env_values(
    group_size: int, groups_per_step: int, max_steps_off_policy: int | None = None
) -> dict[str, Any]:
    """The environment fields the server decides, as a run's config shows them (the runner
    puts the per-run values into the environment's YAML)."""
    return {
        "rollout_server_url": f"http://127.0.0.1:{PER_RUN}",
        "batch_size": group_size * groups_per_step,  # sequences, as the trajectory API counts
        "max_batches_offpolicy": offpolicy_batches(max_steps_off_policy),
        "data_path_to_save_groups": None,
        "data_dir_to_save_evals": f"{PER_RUN}/atropos/evals (the run's folder)",
        "openai": [
            {
                "base_url": f"http://127.0.0.1:{PER_RUN}/v1 (the run's current policy)",
                "api_key": "a key made for the run",
                "server_type": "sglang",
                "tokenizer_name": "the model's tokenizer, as a local folder",
                "health_check": False,
            }
        ],
    }


LOCKED_ENV_FIELDS = frozenset(locked_env_values(1, 1))


class AtroposTrainingConfig(TrainingConfig):
    """The training half of an Atropos run's config: model, LoRA, optimizer, loss, sampling
    defaults, W&B, resources, and how many of the environment's groups make a step."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    LOCKED: ClassVar[frozenset[str]] = TrainingConfig.LOCKED
    SEQUENCE_IDS: ClassVar[bool] = False  # its groups carry none

    groups_per_step: int = Field(
        2,
        ge=1,
        le=4096,
        description="Scored groups per training step; the trajectory API's batch_size (in "
        "sequences) is this times group_size",
    )
    max_token_trainer_length: int | None = Field(
        None,
        ge=2,
        le=1_048_576,
        description="Longest sequence (prompt and response) a step trains on, as tinker-atropos "
        "named it; the environment drops groups that reach it (default: the model's context)",
    )


class AtroposRunConfig(AtroposTrainingConfig):
    """An Atropos run's whole config, as frozen: the training fields, typed, the two fields of
    the environment's that the server and the runner rely on, and the rest of the environment's
    fields as its own config class validated them (extra)."""

    model_config = ConfigDict(extra="allow", validate_assignment=False)

    total_steps: int = Field(ge=1, le=1_000_000, description="Training steps")
    group_size: int = Field(ge=1, le=4096, description="Responses scored together")

    @property
    def environments(self) -> dict[str, Any]:
        """No multi-environment mixes: an Atropos run trains its one environment."""
        return {}

    def env_values(self) -> dict[str, Any]:
        """The environment's own fields (everything that is neither ours nor locked)."""
        extra = self.model_extra or {}
        values = {k: v for k, v in extra.items() if k not in LOCKED_ENV_FIELDS}
        values.update(total_steps=self.total_steps, group_size=self.group_size)
        return values


def offline_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment variables of an Atropos process: `base` without our interpreter's
    path settings, our own settings (a database URL may hold a password), or Atropos switches
    that would fake a server; hubs switched off (a load that would download fails at once
    instead of hanging)."""
    env = {
        k: v
        for k, v in base.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")
        and not k.startswith(("ATROPOS_", "SLURM_", "RLCS_"))
    }
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


def atropos_environment(base: Mapping[str, str], **extra: str) -> dict[str, str]:
    """The environment variables of an Atropos process we start: offline, no secrets (`base`
    has none), our watch on the PYTHONPATH (the sitecustomize in runners/atropos/envside/hooks:
    the process ends its group itself once the runner is gone, however it went)."""
    env = offline_environment(base)
    env["PYTHONPATH"] = str(HOOKS_DIR)
    env[PARENT_VARIABLE] = str(os.getpid())
    env.update(extra)
    return env
