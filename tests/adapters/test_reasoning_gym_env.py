"""The reasoning-gym adapter: own answers score 1, garbage 0 (with a metric), free prompts."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from environments.base import Unscorable
from environments.reasoning_gym_env import ReasoningGymConfig, ReasoningGymEnv
from environments.support import rg_catalog
from environments.support.quiet_import import import_quietly


def env_for(dataset: str, **values: object) -> ReasoningGymEnv:
    return ReasoningGymEnv(ReasoningGymConfig(dataset=dataset, **values))


@pytest.mark.parametrize(
    "dataset", ["leg_counting", "basic_arithmetic", "spell_backward", "prime_factorization"]
)
def test_items_score_one_on_their_own_boxed_answers(dataset: str) -> None:
    env = env_for(dataset)
    for seed in (0, 7, 1234):
        for split in ("train", "eval"):
            task = env.get_task(seed, split)
            assert task.prompt.endswith("Put your final answer within \\boxed{}.")
            answer = task.answer["answer"]
            assert env.score(task.prompt, f"Reasoning... \\boxed{{{answer}}}", task) == 1.0


def test_episode_through_reset_and_step() -> None:
    env = env_for("leg_counting")

    async def play(response: str) -> tuple[str, object]:
        prompt = await env.reset(5)
        return prompt, await env.step(response)

    prompt, _ = asyncio.run(play(""))
    answer = env.get_task(5).answer["answer"]
    _, right = asyncio.run(play(f"\\boxed{{{answer}}}"))
    _, none = asyncio.run(play(answer))  # no box: no answer
    assert right.reward == 1.0 and right.done and right.metrics["score_error"] == 0.0
    assert none.reward == 0.0 and none.metrics["no_answer"] == 1.0


def test_a_verifier_that_raises_scores_zero_with_a_metric() -> None:
    env = env_for("prime_factorization")

    async def play() -> object:
        await env.reset(3)
        return await env.step("I think it is \\boxed{garbage}")

    result = asyncio.run(play())
    assert result.reward == 0.0 and result.done
    assert result.metrics == {"no_answer": 0.0, "score_error": 1.0}


def test_train_and_eval_items_come_from_different_seeds() -> None:
    env = env_for("basic_arithmetic")
    train = [env.get_task(i, "train").prompt for i in range(10)]
    held_out = [env.get_task(i, "eval").prompt for i in range(10)]
    assert train == [env.get_task(i).prompt for i in range(10)]  # deterministic
    assert train != held_out
    assert env.get_task(3).prompt == env.get_task(3 + 500).prompt  # index = seed % size


def test_free_prompts_are_scored_when_they_are_items_else_unscorable() -> None:
    env = env_for("leg_counting", size=50)
    for split in ("train", "eval"):
        task = env.get_task(9, split)
        answer = task.answer["answer"]
        assert env.score(task.prompt, f"\\boxed{{{answer}}}") == 1.0
        question = task.answer["question"]  # the bare question works too
        assert env.score(question, f"\\boxed{{{answer}}}") == 1.0
        assert env.score(question, "\\boxed{-1}") == 0.0
    with pytest.raises(Unscorable, match="not a question of reasoning-gym dataset"):
        env.score("How many legs does a spider have?", "\\boxed{8}")


def test_dataset_config_reaches_the_dataset() -> None:
    env = env_for("leg_counting", dataset_config={"min_animals": 1, "max_animals": 1})
    for seed in range(5):
        assert len(env.get_task(seed).answer["metadata"]["animals"]) == 1


def test_catalog_read_from_source_matches_reasoning_gym() -> None:
    rg = import_quietly("reasoning_gym")
    assert set(rg_catalog.names()) == set(rg.factory.DATASETS)
    for name, (_, config_cls) in rg.factory.DATASETS.items():
        fields = {f.name for f in dataclasses.fields(config_cls)}
        assert rg_catalog.config_fields(name) in (None, frozenset(fields)), name


@pytest.mark.parametrize(
    ("values", "field", "needle"),
    [
        ({"dataset": "leg_countin"}, "dataset", "'leg_counting'"),
        ({"dataset": "composite"}, "dataset", "not supported"),
        ({"dataset_config": {"min_animal": 2}}, "dataset_config", "'min_animals'"),
        ({"dataset_config": {"seed": 2}}, "dataset_config", "dataset_seed"),
        ({"eval_dataset_seed": 42}, "eval_dataset_seed", "differ"),
    ],
)
def test_config_errors_name_the_field(values: dict, field: str, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        ReasoningGymConfig.model_validate(values, strict=True)
    error = info.value.errors()[0]  # type: ignore[attr-defined]
    assert error["loc"] == (field,) and needle in error["msg"]
