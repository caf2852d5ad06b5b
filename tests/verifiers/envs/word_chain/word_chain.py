"""A word chain over several turns: a multi-turn verifiers environment built in memory."""

import verifiers as vf
from datasets import Dataset

STARTS = ["apple", "tiger", "ocean", "lemon", "zebra", "house"]


class WordChainEnv(vf.MultiTurnEnv):
    """After each answer the user asks for a word that starts with its last letter."""

    async def env_response(self, messages, state, **kwargs):
        last = messages[-1]["content"] if messages else ""
        word = last.strip().split()[-1].strip(".,!'\"").lower() if last.strip() else "a"
        letter = word[-1] if word else "a"
        return [{"role": "user", "content": f"Now a word that starts with '{letter}'."}]


def load_environment(max_turns: int = 2, num_examples: int = 6):
    rows = [
        {"question": f"Say a word that starts with the last letter of '{w}'.", "answer": w}
        for w in (STARTS * (num_examples // len(STARTS) + 1))[:num_examples]
    ]

    def chained(completion, answer, **_) -> float:
        words = [m["content"].strip().split() for m in completion if m["role"] == "assistant"]
        firsts = [w[0].strip(".,!'\"").lower() for w in words if w]
        previous, good = answer, 0
        for word in firsts:
            if word and previous and word[0] == previous[-1]:
                good += 1
            previous = word
        return good / max(1, len(words))

    def letters(completion, **_) -> float:
        said = " ".join(m["content"] for m in completion if m["role"] == "assistant")
        return min(1.0, len(said) / 400.0)  # short answers: rewards that differ

    rubric = vf.Rubric(funcs=[chained, letters], weights=[1.0, 0.5])
    return WordChainEnv(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=max_turns)
