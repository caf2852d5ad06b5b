"""Repeat a word: a single-turn task with a dense reward (character overlap with the word).

A random policy already earns a little reward here, so learning shows up within a few steps;
the training tests and the demo use it.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from pydantic import Field

from environments.base import EnvConfig, SingleTurnEnv, Split, Task, Unscorable

WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "tiger",
    "piano",
    "lemon",
    "ocean",
    "amber",
    "crane",
    "delta",
    "ember",
    "flint",
    "grape",
    "honey",
    "ivory",
    "jelly",
    "koala",
    "lunar",
)
_PROMPT = re.compile(r"Repeat this word: (\w+)")
_EVAL_SEED_OFFSET = 1_000_003


class RepeatWordConfig(EnvConfig):
    num_words: int = Field(len(WORDS), ge=1, le=len(WORDS), description="How many words to use")


class RepeatWordEnv(SingleTurnEnv):
    """Repeat the given word exactly; partial credit by character overlap."""

    name = "repeat_word"
    Config = RepeatWordConfig
    config: RepeatWordConfig

    def get_task(self, seed: int, split: Split = "train") -> Task:
        rng = random.Random(seed + (_EVAL_SEED_OFFSET if split == "eval" else 0))
        word = rng.choice(WORDS[: self.config.num_words])
        return Task(prompt=f"Repeat this word: {word}", answer=word)

    def score(self, prompt: str, response: str, task: Task | None = None) -> float:
        if task is not None:
            word = str(task.answer)
        else:
            match = _PROMPT.search(prompt)
            if match is None:
                raise Unscorable("the prompt is not of the form 'Repeat this word: WORD'")
            word = match.group(1)
        return overlap(word, response.strip())


def overlap(word: str, text: str) -> float:
    """1.0 for an exact repeat, else the F1 of shared characters (order-free), below 1."""
    if text == word:
        return 1.0
    if not text:
        return 0.0
    common = sum((Counter(word) & Counter(text)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(text), common / len(word)
    return min(0.99, 2 * precision * recall / (precision + recall))
