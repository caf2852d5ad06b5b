"""Every environment framework we train, declared once: its name, how a message names one of its
environments, its run config, its interpreter and inspect script, and by import path the server's
describer, the runner's trainer and the inference client's job. Torch-free and framework-free.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from core.settings import PROJECT_ROOT, Settings

# Whose environment it is: ours (environments.base), Atropos's or a verifiers one.
Framework = Literal["rlcs", "atropos", "verifiers"]


@dataclass(frozen=True)
class FrameworkEntry:
    """One framework. A `module:name` path is imported only by the process that uses it."""

    name: Framework
    label: str  # how a message names one of its environments: "an Atropos"
    trainer: str  # the runner's RunnerBase subclass
    describe: str  # the server's reading of its inspector's first answer
    # The fields a run adds to the environment's own config; None: the environment's Config.
    run_config: str | None = None
    # Its own interpreter (a Settings attribute), how to set it right, its inspect script (run
    # there by path); None: the server's interpreter and `python -m runners.inspector`.
    python_setting: str | None = None
    python_needs: str = ""
    inspect_script: Path | None = None
    # The inference client's job: a class built with (settings, job, sampler, tokenizer,
    # context) whose `run(deadline)` scores; None: ours, run in the client itself.
    inference: str | None = None

    def python(self, settings: Settings) -> str:
        """The interpreter its environment code runs in."""
        if self.python_setting is None:
            return settings.python_executable
        return str(getattr(settings, self.python_setting))


def _envside(framework: str) -> Path:
    return PROJECT_ROOT / "runners" / framework / "envside" / "inspect_env.py"


FRAMEWORKS: dict[Framework, FrameworkEntry] = {
    entry.name: entry
    for entry in (
        FrameworkEntry(
            "rlcs",
            "one of ours",
            "runners.train.loop:Trainer",
            "server.environments.inspector:describe_ours",
        ),
        FrameworkEntry(
            "atropos",
            "an Atropos",
            "runners.atropos.trainer:AtroposTrainer",
            "server.environments.atropos_config:describe_atropos",
            run_config="core.atropos:AtroposRunConfig",
            python_setting="atropos_python",
            python_needs="RLCS_ATROPOS_PYTHON at a Python with atroposlib 0.4 (.venv-atropos)",
            inspect_script=_envside("atropos"),
            inference="runners.atropos.inference:AtroposInference",
        ),
        FrameworkEntry(
            "verifiers",
            "a verifiers",
            "runners.verifiers.trainer:VerifiersTrainer",
            "server.environments.verifiers.config:describe_verifiers",
            run_config="core.verifiers:VerifiersRunConfig",
            python_setting="verifiers_python",
            python_needs="RLCS_VERIFIERS_PYTHON at a Python with verifiers 0.3 (.venv-verifiers)",
            inspect_script=_envside("verifiers"),
            inference="runners.verifiers.inference:VerifiersInference",
        ),
    )
}
assert set(FRAMEWORKS) == set(get_args(Framework)), "every framework has its entry"


def load(path: str) -> Any:
    """What a `module:name` path names, imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
