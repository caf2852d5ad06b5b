"""Count up to a number: a single-turn Atropos environment with a config class of its own,
sampling plain completions through managed_server; its config_init gives a bare
ServerBaseline (the server's address comes from the trainer's YAML).

Written for the RL control server's tests in the style of Atropos's own environments.
"""

import random
from typing import Literal, Optional, Tuple

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup, ServerBaseline
from atroposlib.type_definitions import Item


class CountingConfig(BaseEnvConfig):
    max_number: int = Field(default=5, ge=1, le=9, description="Count up to at most this")
    reward_style: Literal["exact", "partial"] = Field(
        default="partial", description="exact: 1 or 0; partial: share of the numbers in order"
    )
    prompt_prefix: str = Field(default="Count:", description="Starts every prompt")


class CountingEnv(BaseEnv):
    name = "counting"
    env_config_cls = CountingConfig

    @classmethod
    def config_init(cls) -> Tuple[CountingConfig, ServerBaseline]:
        env_config = CountingConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
            group_size=3,
            total_steps=10,
            batch_size=6,
            steps_per_eval=0,
            max_token_length=8,
            max_number=4,
            wandb_name="counting",
        )
        return env_config, ServerBaseline(model_name="default")

    async def setup(self):
        self.rng = random.Random(3)

    async def get_next_item(self) -> Item:
        return (self.rng.randint(2, self.config.max_number),)

    def score(self, upto: int, text: str) -> float:
        wanted = [str(n) for n in range(1, upto + 1)]
        got = [c for c in text if c.isdigit()]
        if self.config.reward_style == "exact":
            return 1.0 if got[: len(wanted)] == wanted else 0.0
        hits = sum(1 for a, b in zip(wanted, got) if a == b)
        return round(hits / len(wanted) + 0.01 * min(len(text), 10), 4)

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], list]:
        upto = item[0]
        prompt = f"{self.config.prompt_prefix} 1 to {upto}:"
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.completion(
                prompt=prompt,
                n=self.config.group_size,
                max_tokens=self.config.max_token_length,
                temperature=1.0,
            )
            nodes = managed.get_state()["nodes"]
        scored = ScoredDataGroup()
        scored["tokens"] = [node.tokens for node in nodes]
        scored["masks"] = [node.masked_tokens for node in nodes]
        scored["inference_logprobs"] = [node.logprobs for node in nodes]
        scored["scores"] = [self.score(upto, choice.text) for choice in completion.choices]
        return scored, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    CountingEnv.cli()
