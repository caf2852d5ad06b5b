"""A multi-turn RL script written for Tinker, in the style of the GEM trainer this project grew
from (our own code): a number-guessing game, episodes sampled from sampler weights saved each
step, discounted returns normalised over the batch, importance sampling, checkpoints in a
checkpoints.jsonl. It reads nothing but TINKER_BASE_URL and TINKER_API_KEY to find Tinker.

    python guess_train.py model_name=tiny-random max_steps=2 log_dir=/tmp/guess
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import tinker
from tinker import types


@dataclass
class Config:
    model_name: str = "tiny-random"
    lora_rank: int = 8
    learning_rate: float = 1e-4
    batch_size: int = 8  # transitions per step
    num_env: int = 4
    max_turns: int = 3
    max_tokens: int = 8
    gamma: float = 0.9
    max_steps: int = 2
    save_every: int = 1
    seed: int = 0
    log_dir: str = "./guess_output"


def parse(argv: list[str]) -> Config:
    """key=value arguments, as chz takes them."""
    config = Config()
    types_of = {f.name: type(getattr(config, f.name)) for f in fields(Config)}
    for arg in argv:
        key, _, value = arg.partition("=")
        setattr(config, key, types_of[key](value))
    return config


class GuessTheNumber:
    """Guess a number from 1 to 4 in a few turns; told higher or lower after each guess."""

    def __init__(self, rng: random.Random, max_turns: int) -> None:
        self.rng, self.max_turns = rng, max_turns

    def reset(self) -> str:
        self.secret, self.turn = self.rng.randint(1, 4), 0
        return "I am thinking of a number from 1 to 4. Your guess:"

    def step(self, action: str) -> tuple[str, float, bool]:
        self.turn += 1
        found = re.search(r"[1-4]", action)
        if found and int(found[0]) == self.secret:
            return "Correct!", 1.0, True
        hint = "no number" if not found else ("higher" if int(found[0]) < self.secret else "lower")
        return f"Wrong ({hint}). Guess again:", 0.0, self.turn >= self.max_turns


def prompt_text(observation: str) -> str:
    return f"<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n"


async def play(env, sampler, tokenizer, params: types.SamplingParams) -> list[dict]:
    transitions, observation = [], env.reset()
    while True:
        tokens = tokenizer.encode(prompt_text(observation), add_special_tokens=False)
        result = await sampler.sample(types.ModelInput.from_ints(tokens), 1, params)
        sequence = result.sequences[0]
        observation, reward, done = env.step(tokenizer.decode(sequence.tokens))
        transitions.append(
            {
                "obs": tokens,
                "act": sequence.tokens,
                "act_logprobs": sequence.logprobs,
                "reward": reward,
            }
        )
        if done:
            return transitions


def with_returns(episodes: list[list[dict]], gamma: float, batch_size: int) -> list[dict]:
    """Discounted returns per turn, normalised over the batch (ReBN), at most a batch."""
    transitions = []
    for episode in episodes:
        ret = 0.0
        for transition in reversed(episode):
            ret = transition["reward"] + gamma * ret
            transition["return"] = ret
        transitions.extend(episode)
    returns = np.array([t["return"] for t in transitions])
    returns = (returns - returns.mean()) / (returns.std() + 1e-9)
    for transition, value in zip(transitions, returns, strict=True):
        transition["return"] = float(value)
    return transitions[:batch_size]


def datum(transition: dict) -> types.Datum:
    tokens = transition["obs"] + transition["act"]
    prompt_len = len(transition["obs"]) - 1
    acted = len(tokens) - 1 - prompt_len
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.array(tokens[1:], dtype=np.int64)),
            "logprobs": types.TensorData.from_numpy(
                np.array([0.0] * prompt_len + transition["act_logprobs"], dtype=np.float32)
            ),
            "advantages": types.TensorData.from_numpy(
                np.array([0.0] * prompt_len + [transition["return"]] * acted, dtype=np.float32)
            ),
        },
    )


async def main(config: Config) -> None:
    log_dir = Path(config.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    service = tinker.ServiceClient()
    training = await service.create_lora_training_client(
        base_model=config.model_name, rank=config.lora_rank, seed=config.seed
    )
    tokenizer = training.get_tokenizer()
    envs = [
        GuessTheNumber(random.Random(rng.random()), config.max_turns) for _ in range(config.num_env)
    ]
    params = types.SamplingParams(max_tokens=config.max_tokens, temperature=1.0)
    adam = types.AdamParams(learning_rate=config.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8)

    for step in range(config.max_steps):
        started = time.time()
        path = training.save_weights_for_sampler(name=f"{step:06d}").result().path
        sampler = service.create_sampling_client(model_path=path).result()
        episodes: list[list[dict]] = []
        while sum(len(e) for e in episodes) < config.batch_size:
            episodes += await asyncio.gather(*(play(e, sampler, tokenizer, params) for e in envs))
        transitions = with_returns(episodes, config.gamma, config.batch_size)

        fwd_bwd = training.forward_backward([datum(t) for t in transitions], "importance_sampling")
        optim = training.optim_step(adam)
        output, _ = await fwd_bwd, await optim
        diffs = np.concatenate(
            [
                np.array(t["act_logprobs"]) - out["logprobs"].to_numpy()[len(t["obs"]) - 1 :]
                for t, out in zip(transitions, output.loss_fn_outputs, strict=True)
            ]
        )
        metrics = {
            "step": step,
            "episode_return": float(np.mean([sum(t["reward"] for t in e) for e in episodes])),
            "turns_per_episode": float(np.mean([len(e) for e in episodes])),
            "kl_sample_train_v1": float(diffs.mean()),
            "kl_sample_train_v2": float(0.5 * (diffs**2).mean()),
            "time_step": time.time() - started,
            **{f"train/{k}": v for k, v in output.metrics.items()},
        }
        print(json.dumps(metrics), flush=True)
        if config.save_every and (step + 1) % config.save_every == 0:
            saved = await training.save_state(f"{step + 1:06d}")
            record = {"name": f"{step + 1:06d}", "batch": step + 1, "state_path": saved.path}
            with (log_dir / "checkpoints.jsonl").open("a") as index:
                index.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
