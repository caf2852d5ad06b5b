"""Reverse a word, letter by letter: a single-turn verifiers environment built in memory."""

import difflib

import verifiers as vf
from datasets import Dataset

WORDS = ["planet", "garden", "silver", "rocket", "window", "meadow", "candle", "forest"]


def load_environment(num_examples: int = 8, system_prompt: str = "Answer with one word.", **kwargs):
    """Each example asks for one word reversed; the reward is the similarity of the answer."""
    if num_examples < 1:
        raise ValueError("num_examples must be at least 1")
    rows = [
        {"question": f"Write the word '{word}' backwards.", "answer": word[::-1]}
        for word in (WORDS * (num_examples // len(WORDS) + 1))[:num_examples]
    ]

    def similarity(completion, answer, **_) -> float:
        text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
        guess = text.strip().split()[0].strip(".'\"").lower() if text.strip() else ""
        return difflib.SequenceMatcher(None, guess, answer).ratio()

    def brevity(completion, **_) -> float:
        text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
        return 1.0 / (1.0 + len(text) / 10.0)  # by characters: answers' rewards differ

    rubric = vf.Rubric(funcs=[similarity, brevity], weights=[1.0, 0.1])
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        system_prompt=system_prompt,
        rubric=rubric,
        **kwargs,
    )
