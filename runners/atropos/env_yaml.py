"""The YAML an Atropos environment is started with (`serve --config` or `process --config`):
the run's values for the environment's own fields, the fields the server decides, and the
inference face as its server: two identical entries, so that atroposlib uses them whatever its
`config_init()` returns (one entry is merged into a single default server, but ignored beside
two or more, and in process mode beside a bare ServerBaseline; two or more replace them all).
Everything goes in the file: a `--env.x -1` flag would be read as `True`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from core.atropos import AtroposRunConfig, offpolicy_batches

SERVER_TIMEOUT_S = 1200  # atroposlib's own default for one request


def env_section(
    config: AtroposRunConfig, *, tokenizer_dir: str, api_url: str, wandb_name: str, evals_dir: Path
) -> dict[str, Any]:
    env = config.env_values()
    env.update(
        tokenizer_name=tokenizer_dir,  # a local folder: nothing is downloaded
        rollout_server_url=api_url,
        # Always on: its wandb_log is how its own metrics reach the run's history; W&B itself
        # is offline (or disabled) in its process.
        use_wandb=True,
        wandb_name=wandb_name,
        batch_size=config.group_size * config.groups_per_step,
        max_batches_offpolicy=offpolicy_batches(config.max_steps_off_policy),
        data_path_to_save_groups=None,
        data_dir_to_save_evals=str(evals_dir),
    )
    return env


def server_entries(
    model_name: str, face_url: str, key: str, tokenizer_dir: str
) -> list[dict[str, Any]]:
    server = {
        "model_name": model_name,
        "base_url": f"{face_url}/v1",
        "api_key": key,
        "server_type": "sglang",  # managed_server needs it; chat and completions work too
        "tokenizer_name": tokenizer_dir,
        "health_check": False,  # else it asks for a one-token completion every second
        "timeout": SERVER_TIMEOUT_S,
    }
    return [server, dict(server)]


def write_env_yaml(
    path: Path,
    config: AtroposRunConfig,
    *,
    tokenizer_dir: str,
    api_url: str,
    face_url: str,
    key: str,
    wandb_name: str,
    evals_dir: Path,
) -> Path:
    document = {
        "env": env_section(
            config,
            tokenizer_dir=tokenizer_dir,
            api_url=api_url,
            wandb_name=wandb_name,
            evals_dir=evals_dir,
        ),
        "openai": server_entries(config.model_name, face_url, key, tokenizer_dir),
        "slurm": False,
        "testing": False,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    path.chmod(0o600)  # it holds the run's key
    return path
