"""Adapter for GEM (gem-llm) environments: any offline-ready id through `gem.make(id)`, with
GEM's own wrappers. Each episode owns its GEM env and its own global-RNG state."""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from environments.base import BaseEnv, EnvConfig, EnvContext, Split, StepResult
from environments.support import gem_catalog
from environments.support.pkgsrc import require
from environments.support.quiet_import import import_quietly
from environments.support.rng import RngSlot

# Cheap (finds, does not import): a missing extra shows as "not importable" in the listing.
require("gem", "gem")

# Eval episodes seed GEM from a range disjoint from training's, so evaluation is held out.
_EVAL_SEED_OFFSET = 1_000_003

# The reference GEM trainer's prompt templates (its `template` setting), as user-message text:
# the runner wraps the observation in the model's chat template as one user turn.
TEMPLATES = {
    "game": (
        "You are playing language games. Make valid actions to win.\nObservation: {observation}"
        "\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    ),
    "general": (
        "Question: {observation}"
        "\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    ),
    "none": "{observation}",
}


class GemConfig(EnvConfig):
    env_id: str = Field(
        "game:GuessTheNumber-v0-easy",
        max_length=200,
        description="A GEM id (gem.make), e.g. game:Sokoban-v0-easy or rg:leg_counting",
    )
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the environment's constructor (override the id's)",
    )
    observation_template: Literal["game", "general", "none"] = Field(
        "game",
        description="Text around each observation, as in the GEM trainer: game, general or none",
    )
    wrappers: str = Field(
        "concat",
        max_length=512,
        description="Comma list of GEM wrappers, applied in order (tool, observation, tracking)",
    )

    @field_validator("env_id")
    @classmethod
    def _known_id(cls, value: str) -> str:
        gem_catalog.check_env_id(value)
        return value

    # Field validators (not a model validator) so that an error names its field; the fields
    # they compare with are declared before them.
    @field_validator("env_kwargs")
    @classmethod
    def _known_kwargs(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "env_id" in info.data:
            gem_catalog.check_env_kwargs(info.data["env_id"], value)
        return value

    @field_validator("wrappers")
    @classmethod
    def _known_wrappers(cls, value: str, info: ValidationInfo) -> str:
        chosen = gem_catalog.check_wrappers(value)
        chat = [w.name for w in chosen if w.needs_tokenizer]
        plain = info.data.get("prompt_template") == "plain"
        if chat and not (plain and info.data.get("observation_template") == "none"):
            raise ValueError(
                f"wrapper {chat[0]!r} renders the model's chat template itself: set "
                "prompt_template to 'plain' and observation_template to 'none' with it"
            )
        return ",".join(w.name for w in chosen)


class GemEnv(BaseEnv):
    """Any GEM environment (games, reasoning-gym ids) by id, with GEM's observation wrappers."""

    name = "gem"
    Config = GemConfig
    config: GemConfig

    def __init__(self, config: GemConfig | None = None, context: EnvContext | None = None) -> None:
        super().__init__(config, context)
        self._env: Any = None
        self._rng = RngSlot()
        self._done = False

    async def reset(self, seed: int, split: Split = "train") -> str:
        cfg = self.config
        gem = import_quietly("gem")
        wrapper_fns = _wrapper_fns(cfg.wrappers, cfg.model_name, self.context)
        gem_seed = (seed + (_EVAL_SEED_OFFSET if split == "eval" else 0)) % 2**32
        # Construction draws from the global RNG too (GuessTheNumber resets itself in __init__).
        with self._rng.active():
            env = gem.make(cfg.env_id, **cfg.env_kwargs)
            for wrap in wrapper_fns:
                env = wrap(env)
            observation, _info = env.reset(seed=gem_seed)
        self._env, self._done = env, False
        return self._format(observation)

    async def step(self, action: str) -> StepResult:
        if self._env is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        with self._rng.active():
            observation, reward, terminated, truncated, info = self._env.step(action)
        self._done = bool(terminated or truncated)
        metrics: dict[str, float] = {}
        if self._done:
            metrics["truncated"] = float(bool(truncated))
        if isinstance(info, dict) and info.get("use_tool"):
            metrics["tool_use"] = 1.0
        return StepResult(self._format(observation), float(reward), self._done, metrics)

    async def close(self) -> None:
        env, self._env = self._env, None
        close = getattr(env, "close", None)
        if callable(close):
            with self._rng.active():
                close()

    def _format(self, observation: Any) -> str:
        return TEMPLATES[self.config.observation_template].format(observation=str(observation))


def _wrapper_fns(names: str, model_name: str, context: EnvContext) -> list[Any]:
    """GEM's wrapper constructors in order; chat wrappers get the run model's tokenizer."""
    factory = import_quietly("gem.wrappers.wrapper_factory")
    fns = []
    for wrapper in gem_catalog.check_wrappers(names):
        fn = factory.WRAPPER_FACTORY[wrapper.name]
        if wrapper.needs_tokenizer:
            fn = partial(fn, tokenizer=_tokenizer(model_name, context))
        fns.append(fn)
    return fns


_tokenizers: dict[str, Any] = {}


def _tokenizer(model_name: str, context: EnvContext) -> Any:
    """The run model's tokenizer from the runner's loader, once per model per process."""
    if model_name in _tokenizers:
        return _tokenizers[model_name]
    tokenizer = context.tokenizer(model_name)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"the tokenizer of {model_name!r} has no chat template, which GEM's chat wrappers "
            "need; use the concat or concat_with_action wrapper instead"
        )
    _tokenizers[model_name] = tokenizer
    return tokenizer
