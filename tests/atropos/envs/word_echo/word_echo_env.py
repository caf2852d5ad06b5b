"""Echo a word: a single-turn Atropos environment through managed_server, partial credit.

Written for the RL control server's tests in the style of Atropos's own environments (a
helper module beside it, a config.yaml, `cli()` at the bottom).
"""

import difflib
import random
from typing import Dict, List, Optional, Tuple

from words import WORDS

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    ScoredDataGroup,
)
from atroposlib.type_definitions import Item

system_prompt = "Answer with the word you are asked to repeat, and nothing else."


class WordEchoEnv(BaseEnv):
    name = "word_echo"

    def __init__(
        self,
        config: BaseEnvConfig,
        server_configs: List[APIServerConfig],
        slurm=False,
        testing=False,
    ):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = list()

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        env_config = BaseEnvConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
            group_size=4,
            use_wandb=True,
            rollout_server_url="http://localhost:8000",
            total_steps=20,
            batch_size=8,
            steps_per_eval=0,
            max_token_length=8,
            wandb_name="word_echo",
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
                base_url="http://localhost:9001/v1",
                api_key="x",
                server_type="sglang",
                num_requests_for_eval=16,
            )
        ]
        return env_config, server_configs

    async def setup(self):
        self.rng = random.Random(7)
        self.iter = 0

    async def get_next_item(self) -> Item:
        self.iter += 1
        return (self.rng.choice(WORDS),)

    async def collect_trajectories(self, item: Item) -> Tuple[ScoredDataGroup, List[Item]]:
        word = item[0]
        messages = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": f"Repeat this word: {word}"},
        ]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=messages,
                n=self.config.group_size,
                max_tokens=self.config.max_token_length,
                temperature=1.0,
                stop=[self.tokenizer.eos_token_id],
            )
            nodes = managed.get_state()["nodes"]
        scored = ScoredDataGroup()
        scored["tokens"] = list()
        scored["masks"] = list()
        scored["scores"] = list()
        scored["inference_logprobs"] = list()
        for choice, node in zip(completion.choices, nodes):
            score = self.score(word, choice.message.content or "")
            self.percent_correct_buffer.append(1.0 if score >= 1.0 else 0.0)
            scored["tokens"].append(node.tokens)
            scored["masks"].append(node.masked_tokens)
            scored["inference_logprobs"].append(node.logprobs)
            scored["scores"].append(score)
        return scored, []

    @staticmethod
    def score(word: str, response: str) -> float:
        """Partial credit: how close the response is to the word (1.0 when it is the word)."""
        answer = response.strip().lower()
        if answer == word:
            return 1.0
        return round(difflib.SequenceMatcher(None, word, answer).ratio(), 4)

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        if wandb_metrics is None:
            wandb_metrics = {}
        if self.percent_correct_buffer:
            wandb_metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(
                self.percent_correct_buffer
            )
        self.percent_correct_buffer = list()
        await super().wandb_log(wandb_metrics)

    async def evaluate(self, *args, **kwargs):
        scores = []
        for word in WORDS[:2]:
            completion = await self.server.chat_completion(
                messages=[{"role": "user", "content": f"Repeat this word: {word}"}],
                n=1,
                max_tokens=self.config.max_token_length,
                temperature=0.0,
                split="eval",
            )
            scores.append(self.score(word, completion.choices[0].message.content or ""))
        correct = sum(1.0 for s in scores if s >= 1.0) / len(scores)
        await self.evaluate_log(metrics={"eval/percent_correct": correct})


if __name__ == "__main__":
    WordEchoEnv.cli()
