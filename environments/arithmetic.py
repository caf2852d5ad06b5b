"""Arithmetic questions with a checked answer in \\boxed{} (single-turn)."""

from __future__ import annotations

import random
import re

from pydantic import Field

from environments.base import EnvConfig, SingleTurnEnv, Split, Task, Unscorable
from environments.support.answers import last_boxed

_EVAL_SEED_OFFSET = 1_000_003
_QUESTION = re.compile(r"What is (-?\d+) ([+\-*]) (-?\d+)\?")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticConfig(EnvConfig):
    max_operand: int = Field(20, ge=1, le=1_000_000)
    operations: str = Field(
        "+-*", min_length=1, pattern=r"^[+\-*]+$", description="Which of + - * to ask about"
    )


class ArithmeticEnv(SingleTurnEnv):
    """Integer arithmetic: answer `What is a op b?` with the result in \\boxed{}."""

    name = "arithmetic"
    Config = ArithmeticConfig
    config: ArithmeticConfig

    def get_task(self, seed: int, split: Split = "train") -> Task:
        rng = random.Random(seed + (_EVAL_SEED_OFFSET if split == "eval" else 0))
        a = rng.randint(0, self.config.max_operand)
        b = rng.randint(0, self.config.max_operand)
        op = rng.choice(self.config.operations)
        prompt = f"What is {a} {op} {b}? Put the final answer in \\boxed{{}}."
        return Task(prompt=prompt, answer=_OPS[op](a, b))

    def score(self, prompt: str, response: str, task: Task | None = None) -> float:
        expected = task.answer if task is not None else _answer_from_prompt(prompt)
        given = last_boxed(response)
        if given is None:
            return 0.0
        try:
            return 1.0 if int(given.replace(",", "")) == expected else 0.0
        except ValueError:
            return 0.0


def _answer_from_prompt(prompt: str) -> int:
    match = _QUESTION.search(prompt)
    if match is None:
        raise Unscorable("the prompt is not of the form 'What is A + B?' (operators + - *)")
    a, op, b = match.groups()
    return _OPS[op](int(a), int(b))
