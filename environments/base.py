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

from pydantic import BaseModel, ConfigDict, Field

from core.training_config import TrainingConfig

Split = Literal["train", "eval"]


class MixEntry(BaseModel):
    """One environment of a multi-environment run: its share of the batch and group size."""

    model_config = ConfigDict(extra="forbid")

    weight: float = Field(1.0, gt=0.0, le=1000.0, description="Share of each batch's groups")
    num_rollouts: int | None = Field(
        None, ge=1, le=256, description="Episodes per task for this environment (group size)"
    )


class EnvConfig(TrainingConfig):
    """An environment's config: the episode, batch and run-length fields every environment has,
    on top of the training config it includes (model, LoRA, optimizer, loss, W&B, resources).
    Environments subclass this and add their own fields."""

    # Episodes and batches.
    group_size: int = Field(4, ge=1, le=256, description="Episodes per task (rollouts per prompt)")
    batch_size: int = Field(8, ge=1, le=4096, description="Task groups per training step")
    max_token_length: int = Field(
        256, ge=1, le=32768, description="Most tokens the model may generate in one turn"
    )
    max_num_workers: int = Field(
        -1, ge=-1, le=1024, description="Episodes in flight at once (-1 = automatic)"
    )
    # Run length and evaluation.
    total_steps: int = Field(20, ge=1, le=1_000_000, description="Training steps")
    steps_per_eval: int = Field(
        10, ge=0, le=1_000_000, description="Steps between evaluations (0 = never)"
    )
    eval_num_tasks: int = Field(16, ge=1, le=4096, description="Held-out tasks per evaluation")
    # How observations reach the model.
    prompt_template: Literal["chat", "plain"] = Field(
        "chat", description="chat: the tokenizer's chat template; plain: the observation as is"
    )
    system_prompt: str | None = Field(None, max_length=4000)
    environments: dict[str, MixEntry] = Field(
        default_factory=dict,
        description="Multi-environment runs: other environments to mix into each batch, by "
        "name, with weights (this environment is in the mix with weight 1 unless listed); "
        "each uses its own stored config",
    )


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
