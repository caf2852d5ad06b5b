"""Repeat a word, written for Atropos: the same task as environments/repeat_word.py (its words,
its prompt, its character-overlap score) as an Atropos environment sampling through
managed_server, so that benchmarks/doors.py can time both ways of training it side by side.
"""

import random
from collections import Counter
from typing import List, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item

WORDS = (
    "apple", "river", "stone", "cloud", "maple", "tiger", "piano", "lemon", "ocean", "amber",
    "crane", "delta", "ember", "flint", "grape", "honey", "ivory", "jelly", "koala", "lunar",
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


class RepeatWordAtroposEnv(BaseEnv):
    name = "repeat_word_atropos"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        env_config = BaseEnvConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=4,
            total_steps=10,
            steps_per_eval=0,
            max_token_length=16,
            # As our trainer does: groups of equal scores reach it, which drops and counts them.
            ensure_scores_are_not_same=False,
            wandb_name="repeat_word_atropos",
        )
        server = APIServerConfig(model_name="default", base_url="http://localhost:9001/v1")
        return env_config, [server]

    async def setup(self):
        self.rng = random.Random(0)

    async def get_next_item(self) -> Item:
        return (self.rng.choice(WORDS),)

    async def collect_trajectories(self, item: Item) -> Tuple[ScoredDataGroup, list]:
        word = item[0]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=[{"role": "user", "content": f"Repeat this word: {word}"}],
                n=self.config.group_size,
                max_tokens=self.config.max_token_length,
                temperature=1.0,
            )
            nodes = managed.get_state()["nodes"]
        scored = ScoredDataGroup()
        scored["tokens"] = [node.tokens for node in nodes]
        scored["masks"] = [node.masked_tokens for node in nodes]
        scored["inference_logprobs"] = [node.logprobs for node in nodes]
        scored["scores"] = [
            overlap(word, (choice.message.content or "").strip()) for choice in completion.choices
        ]
        return scored, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    RepeatWordAtroposEnv.cli()
