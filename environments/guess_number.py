"""A number-guessing game: find a hidden number with higher/lower hints (multi-turn)."""

from __future__ import annotations

import random

from pydantic import Field, model_validator

from environments.base import BaseEnv, EnvConfig, EnvContext, Split, StepResult
from environments.support.answers import last_boxed

# Eval tasks draw from a seed space disjoint from training's, so evaluation is held out.
_EVAL_SEED_OFFSET = 1_000_003


class GuessNumberConfig(EnvConfig):
    min_number: int = Field(1, ge=0, le=1_000_000)
    max_number: int = Field(10, ge=1, le=1_000_000)
    max_turns: int = Field(4, ge=1, le=64)
    format_penalty: float = Field(
        -0.1, ge=-1.0, le=0.0, description="Reward for a turn with no box"
    )

    @model_validator(mode="after")
    def _range(self) -> GuessNumberConfig:
        if self.max_number <= self.min_number:
            raise ValueError("max_number must be greater than min_number")
        return self


class GuessNumberEnv(BaseEnv):
    """Guess a hidden number in a range within a few turns; hints say higher or lower."""

    name = "guess_number"
    Config = GuessNumberConfig
    config: GuessNumberConfig

    def __init__(
        self, config: GuessNumberConfig | None = None, context: EnvContext | None = None
    ) -> None:
        super().__init__(config, context)
        self._target = 0
        self._turn = 0
        self._history: list[str] = []

    async def reset(self, seed: int, split: Split = "train") -> str:
        rng = random.Random(seed + (_EVAL_SEED_OFFSET if split == "eval" else 0))
        self._target = rng.randint(self.config.min_number, self.config.max_number)
        self._turn = 0
        self._history = []
        return self._observation()

    async def step(self, action: str) -> StepResult:
        cfg = self.config
        self._turn += 1
        boxed = last_boxed(action)
        guess = _as_int(boxed)
        if guess is None:
            return StepResult(
                "No valid guess in \\boxed{}; the game is over.",
                cfg.format_penalty,
                True,
                {"format_error": 1.0},
            )
        if guess == self._target:
            return StepResult(f"Correct! The number was {guess}.", 1.0, True, {"won": 1.0})
        hint = "higher" if self._target > guess else "lower"
        self._history.append(f"Turn {self._turn}: you guessed {guess}; the number is {hint}.")
        if self._turn >= cfg.max_turns:
            # Partial credit for ending close, as in GEM's GuessTheNumber.
            span = cfg.max_number - cfg.min_number
            in_range = cfg.min_number <= guess <= cfg.max_number
            reward = max(0.0, 1.0 - abs(guess - self._target) / span) if in_range else 0.0
            return StepResult(self._observation(final=True), reward, True, {"won": 0.0})
        return StepResult(self._observation(), 0.0, False)

    def _observation(self, final: bool = False) -> str:
        cfg = self.config
        lines = [
            f"Guess the hidden number between {cfg.min_number} and {cfg.max_number} (inclusive) "
            f"within {cfg.max_turns} turns. After each guess you are told whether the number is "
            "higher or lower. Put your guess in \\boxed{}, for example \\boxed{"
            f"{(cfg.min_number + cfg.max_number) // 2}"
            "}.",
            *self._history,
        ]
        if final:
            lines.append(f"Out of turns. The number was {self._target}.")
        else:
            lines.append("Enter your next guess.")
        return "\n".join(lines)


def _as_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return None
