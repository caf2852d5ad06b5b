"""Every answer scores the same: an Atropos environment that never yields a usable group (the
base class drops groups whose scores are all equal), for the RL control server's tests.
"""

from typing import List, Optional, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item


class FlatScoresEnv(BaseEnv):
    name = "flat_scores"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        env_config = BaseEnvConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
            group_size=2,
            total_steps=5,
            batch_size=4,
            steps_per_eval=0,
            max_token_length=4,
            wandb_name="flat_scores",
        )
        return env_config, [APIServerConfig(model_name="default", base_url="", api_key="x")]

    async def setup(self):
        return None

    async def get_next_item(self) -> Item:
        return ("hello",)

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], list]:
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            await managed.chat_completion(
                messages=[{"role": "user", "content": item[0]}],
                n=self.config.group_size,
                max_tokens=self.config.max_token_length,
            )
            nodes = managed.get_state()["nodes"]
        scored = ScoredDataGroup()
        scored["tokens"] = [node.tokens for node in nodes]
        scored["masks"] = [node.masked_tokens for node in nodes]
        scored["scores"] = [0.5 for _ in nodes]
        return scored, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    FlatScoresEnv.cli()
