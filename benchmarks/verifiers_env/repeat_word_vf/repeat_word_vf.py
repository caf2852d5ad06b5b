"""The task of environments/repeat_word.py (its words, its prompt, its character-overlap score)
as a verifiers v0 environment, for benchmarks/verifiers.py: a `SingleTurnEnv` over a dataset
built in memory, scored by a `Rubric`."""

import random
from collections import Counter

import verifiers as vf
from datasets import Dataset

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


def load_environment(num_examples: int = 2000, seed: int = 0):
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(num_examples)]
    rows = [{"question": f"Repeat this word: {w}", "answer": w} for w in words]

    def repeated(completion, answer, **_) -> float:
        return overlap(answer, (completion[-1]["content"] or "").strip())

    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[repeated]))
