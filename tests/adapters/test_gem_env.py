"""The GEM adapter on real GEM games: a winning episode, seeding isolation, logging, wrappers."""

from __future__ import annotations

import asyncio
import importlib
import logging
import random
import re
import sys

import numpy as np
import pytest

from environments.gem_env import GemConfig, GemEnv
from environments.support import gem_catalog
from environments.support.quiet_import import import_quietly

HINT = re.compile(r"target number is (higher|lower) than (\d+)")


async def binary_search(env: GemEnv, seed: int) -> list:
    await env.reset(seed)
    low, high, results = 1, 10, []
    try:
        while True:
            guess = (low + high) // 2
            result = await env.step(f"My guess is \\boxed{{{guess}}}.")
            results.append(result)
            if result.done:
                return results
            direction = HINT.findall(result.observation)[-1][0]
            low, high = (guess + 1, high) if direction == "higher" else (low, guess - 1)
    finally:
        await env.close()


def target(env: GemEnv) -> int:
    return env._env.unwrapped.game_number


def test_binary_search_wins_guess_the_number() -> None:
    for seed in range(5):
        results = asyncio.run(binary_search(GemEnv(GemConfig()), seed))
        assert results[-1].reward == 1.0 and results[-1].done
        assert all(r.reward == 0.0 and not r.done for r in results[:-1])
        assert results[-1].metrics["truncated"] == 0.0
        assert "Congratulations" in results[-1].observation


def test_reference_settings_shape_the_observation() -> None:
    env = GemEnv(GemConfig(env_id="game:GuessTheNumber-v0-easy", wrappers="concat"))
    first = asyncio.run(env.reset(3))
    assert first.startswith("You are playing language games.")
    assert "between 1 and 10 (inclusive) within 4 turns" in first
    assert first.rstrip().endswith("within \\boxed{}.")
    second = asyncio.run(env.step("\\boxed{5}")).observation
    # concat keeps every observation so far, so the model sees the history in one message.
    assert "within 4 turns" in second and "you guessed 5" in second


def test_seeding_leaves_global_rng_alone_and_is_per_episode() -> None:
    random.seed(1234)
    np.random.seed(1234)
    py_state, np_state = random.getstate(), np.random.get_state()[1].copy()

    async def interleaved() -> tuple[int, int, int]:
        a, b, c = GemEnv(GemConfig()), GemEnv(GemConfig()), GemEnv(GemConfig())
        await a.reset(11)
        await b.reset(22)
        await a.step("\\boxed{1}")  # steps of one episode do not move another's target
        await c.reset(11)
        return target(a), target(b), target(c)

    a, b, c = asyncio.run(interleaved())
    assert random.getstate() == py_state
    assert (np.random.get_state()[1] == np_state).all()
    assert a == c
    alone = GemEnv(GemConfig())
    asyncio.run(alone.reset(22))
    assert target(alone) == b
    targets = set()
    for seed in range(12):
        env = GemEnv(GemConfig())
        asyncio.run(env.reset(seed))
        targets.add(target(env))
    assert len(targets) > 3  # different seeds, different games


def test_eval_split_uses_other_seeds() -> None:
    pairs = []
    for seed in range(8):
        train, held_out = GemEnv(GemConfig()), GemEnv(GemConfig())
        asyncio.run(train.reset(seed, "train"))
        asyncio.run(held_out.reset(seed, "eval"))
        pairs.append((target(train), target(held_out)))
    assert any(t != e for t, e in pairs)


def test_importing_gem_leaves_root_logging_alone() -> None:
    import_quietly("gem")
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        for handler in saved_handlers:
            root.removeHandler(handler)
        root.setLevel(logging.WARNING)
        # Re-running gem/__init__.py (its submodules stay cached) repeats its basicConfig call.
        sys.modules.pop("gem")
        import_quietly("gem")
        assert root.handlers == [] and root.level == logging.WARNING
        sys.modules.pop("gem")
        importlib.import_module("gem")  # the plain import: the hazard the helper prevents
        assert root.handlers and root.level == logging.INFO
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)


def test_catalog_read_from_source_matches_gem_registry() -> None:
    registry = import_quietly("gem.envs.registration").ENV_REGISTRY
    assert gem_catalog.registry() == {k: v.entry_point for k, v in registry.items()}
    factory = import_quietly("gem.wrappers.wrapper_factory")
    assert set(gem_catalog.wrappers()) == set(factory.WRAPPER_FACTORY)
    chat = {n for n, w in gem_catalog.wrappers().items() if w.needs_tokenizer}
    assert chat == set(factory.TOKENIZER_REQUIRED)


@pytest.mark.parametrize(
    "env_id", ["game:Mastermind-v0-easy", "game:Minesweeper-v0-easy", "rg:leg_counting"]
)
def test_other_offline_ids_play_a_step(env_id: str) -> None:
    async def one_step() -> tuple[str, float]:
        env = GemEnv(GemConfig(env_id=env_id, observation_template="general"))
        observation = await env.reset(0)
        result = await env.step("\\boxed{1 2}")
        await env.close()
        return observation, result.reward

    observation, reward = asyncio.run(one_step())
    assert observation.startswith("Question: ") and isinstance(reward, float)


def test_env_kwargs_reach_the_constructor() -> None:
    config = GemConfig(env_kwargs={"min_number": 1, "max_number": 3, "max_turns": 2})
    env = GemEnv(config)
    first = asyncio.run(env.reset(0))
    assert "between 1 and 3 (inclusive) within 2 turns" in first


def test_concat_with_action_shows_the_model_its_actions() -> None:
    env = GemEnv(GemConfig(wrappers="concat_with_action,episode_tracking"))
    asyncio.run(env.reset(0))
    assert "Sure: \\boxed{5}" in asyncio.run(env.step("Sure: \\boxed{5}")).observation


@pytest.mark.parametrize(
    ("values", "field", "needle"),
    [
        ({"env_id": "game:GuessTheNumbr-v0-easy"}, "env_id", "game:GuessTheNumber-v0-easy"),
        ({"env_id": "math:GSM8K"}, "env_id", "Hugging Face hub"),
        ({"env_id": "game:Wordle-v0-easy"}, "env_id", "nltk"),
        ({"env_kwargs": {"max_turn": 2}}, "env_kwargs", "max_turns"),
        ({"wrappers": "concat,concatt"}, "wrappers", "concat_chat"),
        ({"wrappers": "search_tool,concat"}, "wrappers", "network"),
        ({"wrappers": "episode_tracking,concat"}, "wrappers", "order"),
        ({"wrappers": "concat_chat"}, "wrappers", "prompt_template"),
    ],
)
def test_config_errors_name_the_field(values: dict, field: str, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        GemConfig.model_validate(values, strict=True)
    error = info.value.errors()[0]  # type: ignore[attr-defined]
    assert error["loc"] == (field,) and needle in error["msg"]
