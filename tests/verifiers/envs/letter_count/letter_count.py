"""Count a letter in a word, with a tool: a tool-using verifiers environment built in memory."""

import verifiers as vf
from datasets import Dataset

WORDS = [("banana", "a"), ("letter", "t"), ("mississippi", "s"), ("coffee", "f")]


def count_letter(word: str, letter: str) -> int:
    """How many times `letter` occurs in `word`."""
    return word.count(letter)


def load_environment(max_turns: int = 3):
    rows = [
        {
            "question": f"How many times does '{letter}' occur in '{word}'?",
            "answer": str(word.count(letter)),
        }
        for word, letter in WORDS
    ]

    def right(completion, answer, **_) -> float:
        said = completion[-1].get("content") or "" if completion else ""
        return 1.0 if answer in said else 0.0

    def short(completion, **_) -> float:
        said = " ".join(str(m.get("content") or "") for m in completion)
        return 1.0 / (1.0 + len(said.split()))

    rubric = vf.Rubric(funcs=[right, short], weights=[1.0, 0.2])
    return vf.ToolEnv(
        dataset=Dataset.from_list(rows), tools=[count_letter], rubric=rubric, max_turns=max_turns
    )
