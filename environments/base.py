"""Base classes every environment derives from, and the config fields they all share.

An environment is text in, text out: `reset(seed)` gives the first observation, `step(action)`
gives a `StepResult`. The runner turns text into tokens. What an environment needs from the
process (a tokenizer for chat wrappers, an API key) is handed in as an `EnvContext`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from core import loss_config
from core.model_names import LOCAL_DEFAULT_MODEL

Split = Literal["train", "eval"]


class MixEntry(BaseModel):
    """One environment of a multi-environment run: its share of the batch and group size."""

    model_config = ConfigDict(extra="forbid")

    weight: float = Field(1.0, gt=0.0, le=1000.0, description="Share of each batch's groups")
    num_rollouts: int | None = Field(
        None, ge=1, le=256, description="Episodes per task for this environment (group size)"
    )


class EnvConfig(BaseModel):
    """Fields every environment has: episode shape, run length, logging and training."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Fields decided by the server: shown to the user, never edited (see `locked_fields`).
    LOCKED: ClassVar[frozenset[str]] = frozenset({"tokenizer_name"})

    # Episodes and batches.
    group_size: int = Field(4, ge=1, le=256, description="Episodes per task (rollouts per prompt)")
    batch_size: int = Field(8, ge=1, le=4096, description="Task groups per training step")
    max_token_length: int = Field(
        256, ge=1, le=32768, description="Most tokens the model may generate in one turn"
    )
    max_num_workers: int = Field(
        -1, ge=-1, le=1024, description="Episodes in flight at once (-1 = automatic)"
    )
    # Run length, evaluation and checkpoints.
    total_steps: int = Field(20, ge=1, le=1_000_000, description="Training steps")
    steps_per_eval: int = Field(
        10, ge=0, le=1_000_000, description="Steps between evaluations (0 = never)"
    )
    eval_num_tasks: int = Field(16, ge=1, le=4096, description="Held-out tasks per evaluation")
    save_every: int = Field(
        5, ge=0, le=1_000_000, description="Steps between checkpoints (0 = only at the end)"
    )
    # Logging.
    use_wandb: bool = Field(True, description="Log to Weights & Biases (offline without a key)")
    wandb_project: str = Field("rl-training", min_length=1, max_length=128)
    wandb_name: str | None = Field(None, max_length=128, description="W&B run name prefix")
    # Model and backend.
    # The class default; the server puts the backend's own default in when a config names none.
    model_name: str = Field(LOCAL_DEFAULT_MODEL, min_length=1, max_length=256)
    tokenizer_name: str = Field(LOCAL_DEFAULT_MODEL, description="Derived from model_name")
    backend: Literal["auto", "local", "tinker"] = Field(
        "auto", description="auto = tinker when TINKER_API_KEY is set, else local"
    )
    # Resources a run asks of a Ray cluster (RLCS_LAUNCHER=ray); ignored by local runs.
    num_gpus: float | None = Field(
        None,
        ge=0,
        le=64,
        description="GPUs for the run's Ray job (default: 1 for a local backend on CUDA, else 0)",
    )
    num_cpus: float | None = Field(
        None, ge=0, le=1024, description="CPUs for the run's Ray job (default: 1)"
    )
    # Optimisation.
    lora_rank: int = Field(32, ge=1, le=512)
    learning_rate: float = Field(4e-5, gt=0, le=1.0)
    loss_fn: Literal["importance_sampling", "ppo", "cispo", "dro"] = "importance_sampling"
    loss_fn_config: dict[str, float] = Field(
        default_factory=dict, description="e.g. clip_low_threshold/clip_high_threshold or beta"
    )
    advantage: Literal["grpo", "rebn"] = Field(
        "grpo", description="grpo: group-relative; rebn: discounted returns, batch-normalised"
    )
    scale_advantage_by_std: bool = Field(False, description="grpo: divide by the group's std")
    gamma: float = Field(0.9, ge=0.0, le=1.0, description="Discount for rebn returns")
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, le=1_000_000)
    prompt_template: Literal["chat", "plain"] = Field(
        "chat", description="chat: the tokenizer's chat template; plain: the observation as is"
    )
    system_prompt: str | None = Field(None, max_length=4000)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    resume_from: str | None = Field(None, description="A state checkpoint path to start from")
    environments: dict[str, MixEntry] = Field(
        default_factory=dict,
        description="Multi-environment runs: other environments to mix into each batch, by "
        "name, with weights (this environment is in the mix with weight 1 unless listed); "
        "each uses its own stored config",
    )

    @field_validator("loss_fn_config")
    @classmethod
    def _known_loss_keys(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        # Checked here, at POST /runs, rather than by the backend after the model loaded.
        loss_fn = info.data.get("loss_fn")
        if loss_fn is not None:
            loss_config.resolve(loss_fn, value)
        return value

    @model_validator(mode="after")
    def _derive_locked(self) -> EnvConfig:
        # The tokenizer always follows the model; bypass validate_assignment to avoid recursion.
        if self.tokenizer_name != self.model_name:
            object.__setattr__(self, "tokenizer_name", self.model_name)
        return self

    @classmethod
    def locked_fields(cls) -> frozenset[str]:
        return cls.LOCKED


@dataclass
class StepResult:
    """What one action did: the next observation, its reward, and whether the episode ended."""

    observation: str
    reward: float
    done: bool
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvContext:
    """What the runner or the inference worker hands an environment; environments read
    nothing from the process themselves (no settings, no environment variables)."""

    # Model name -> its tokenizer, resolved the way the runner resolves models (offline).
    load_tokenizer: Callable[[str], Any] | None = None
    # The service keys an environment may use, by variable name (e.g. OPENREWARD_API_KEY).
    api_keys: Mapping[str, str] = field(default_factory=dict)

    def tokenizer(self, model_name: str) -> Any:
        if self.load_tokenizer is None:
            raise RuntimeError(
                f"this environment needs the tokenizer of {model_name!r}, and was given no "
                "way to load one (EnvContext.load_tokenizer)"
            )
        return self.load_tokenizer(model_name)


class Unscorable(Exception):
    """Raised by `score` when a response cannot be judged for this prompt (says why)."""


class BaseEnv(abc.ABC):
    """A multi-turn text environment. One instance plays one episode at a time."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[EnvConfig]] = EnvConfig

    def __init__(self, config: EnvConfig | None = None, context: EnvContext | None = None) -> None:
        self.config = config if config is not None else self.Config()
        self.context = context if context is not None else EnvContext()

    @abc.abstractmethod
    async def reset(self, seed: int, split: Split = "train") -> str:
        """Start the episode for task `seed` of `split` and return the first observation."""

    @abc.abstractmethod
    async def step(self, action: str) -> StepResult:
        """Apply the model's action text."""

    async def close(self) -> None:
        """Release what the episode holds (sessions, processes); the default holds nothing."""
        return None


@dataclass
class Task:
    """One single-turn question and what the verifier needs to judge it."""

    prompt: str
    answer: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


class SingleTurnEnv(BaseEnv):
    """A question/answer environment: one prompt, one response, one score in [0, 1]."""

    def __init__(self, config: EnvConfig | None = None, context: EnvContext | None = None) -> None:
        super().__init__(config, context)
        self._task: Task | None = None

    @abc.abstractmethod
    def get_task(self, seed: int, split: Split = "train") -> Task:
        """The task with this seed; the same seed always gives the same task."""

    @abc.abstractmethod
    def score(self, prompt: str, response: str, task: Task | None = None) -> float:
        """Score a response in [0, 1]; with no `task`, judge from the prompt or raise Unscorable."""

    async def reset(self, seed: int, split: Split = "train") -> str:
        self._task = self.get_task(seed, split)
        return self._task.prompt

    async def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() called before reset()")
        reward = float(self.score(self._task.prompt, action, self._task))
        return StepResult(observation="", reward=reward, done=True)
