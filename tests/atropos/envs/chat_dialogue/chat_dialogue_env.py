"""Two turns of chat: name a colour, then say it again in capitals. A multi-turn Atropos
environment that samples through `self.server.chat_completion` (an OpenAI-style endpoint) and
tokenizes the dialogue itself, as the gym and game environments do.

Written for the RL control server's tests in the style of Atropos's own environments.
"""

import asyncio
import difflib
import random
from typing import List, Optional, Tuple

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    ScoredDataGroup,
)
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

COLOURS = ["red", "green", "blue", "amber", "violet", "teal"]


class ChatDialogueEnv(BaseEnv):
    name = "chat_dialogue"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        env_config = BaseEnvConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
            group_size=2,
            use_wandb=True,
            total_steps=20,
            batch_size=4,
            steps_per_eval=0,
            max_token_length=6,
            wandb_name="chat_dialogue",
        )
        server_configs = [
            APIServerConfig(
                model_name="default",
                base_url="http://localhost:9001/v1",
                api_key="x",
            )
        ]
        return env_config, server_configs

    async def setup(self):
        self.rng = random.Random(11)

    async def get_next_item(self) -> Item:
        return (self.rng.choice(COLOURS),)

    async def play(self, colour: str) -> Tuple[list, float]:
        messages = [{"role": "user", "content": f"Name a colour, for example {colour}."}]
        first = await self.server.chat_completion(
            messages=messages, n=1, max_tokens=self.config.max_token_length, temperature=1.0
        )
        said = first.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": said})
        messages.append({"role": "user", "content": "Now say it again in capitals."})
        second = await self.server.chat_completion(
            messages=messages, n=1, max_tokens=self.config.max_token_length, temperature=1.0
        )
        again = second.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": again})
        wanted = said.strip().upper() or colour.upper()
        score = difflib.SequenceMatcher(None, wanted, again.strip()).ratio()
        return messages, round(score, 4)

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], list]:
        plays = await asyncio.gather(*(self.play(item[0]) for _ in range(self.config.group_size)))
        scored = ScoredDataGroup()
        scored["tokens"] = list()
        scored["masks"] = list()
        scored["scores"] = list()
        scored["messages"] = list()
        for messages, score in plays:
            out = tokenize_for_trainer(self.tokenizer, messages)
            scored["tokens"].append(out["tokens"])
            scored["masks"].append(out["masks"])
            scored["scores"].append(score)
            scored["messages"].append(messages)
        return scored, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    ChatDialogueEnv.cli()
