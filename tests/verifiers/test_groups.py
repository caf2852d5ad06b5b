"""A verifiers rollout's model calls as the learner's sequences, as prime-rl merges them: a call
whose prompt extends what came before continues one sequence (the environment's tokens between
untrained), another starts a sequence of the same sample; the reward on the last; what cannot
train is left out and counted."""

from __future__ import annotations

from core.verifiers_wire import Group, Rollout, Step
from runners.verifiers.groups import read_groups, rollout_sequences
from tests.support.prepare import prepare


def call(prompt: list[int], completion: list[int], mask: list[int] | None = None) -> Step:
    return Step(
        prompt_ids=prompt,
        completion_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        completion_mask=mask if mask is not None else [1] * len(completion),
    )


def rollout(*steps: Step, reward: float = 1.0, error: str | None = None) -> Rollout:
    return Rollout(reward=reward, steps=list(steps), prompt=[], completion=[], error=error)


def test_turns_that_extend_each_other_are_one_sequence() -> None:
    (merged,) = rollout_sequences(
        rollout(call([1, 2], [3, 4]), call([1, 2, 3, 4, 5, 6], [7]), reward=0.5), 0, 0
    )
    assert merged.tokens == [1, 2, 3, 4, 5, 6, 7]
    assert merged.trained == [False, False, True, True, False, False, True]
    assert merged.logprobs == [0.0, 0.0, -0.5, -0.5, 0.0, 0.0, -0.5]
    assert merged.reward == 0.5


def test_a_turn_that_does_not_extend_starts_a_sequence_of_the_same_sample() -> None:
    first, second = rollout_sequences(
        rollout(call([1, 2], [3, 4], mask=[1, 0]), call([9, 2, 3], [5]), reward=2.0), 3, 7
    )
    assert first.tokens == [1, 2, 3, 4] and first.trained == [False, False, True, False]
    assert second.tokens == [9, 2, 3, 5]
    assert (first.sample, second.sample, first.group) == (7, 7, 3)
    assert (first.reward, second.reward) == (0.0, 2.0)  # the sample's return: their sum


def test_groups_get_advantages_and_what_cannot_train_is_counted() -> None:
    good = Group(
        id=0,
        example=0,
        rollouts=[rollout(call([1], [2]), reward=1.0), rollout(call([1], [3]), reward=0.0)],
    )
    flat = Group(
        id=1,
        example=1,
        rollouts=[rollout(call([1], [2]), reward=1.0), rollout(call([1], [3]), reward=1.0)],
    )
    bad = Group(
        id=2,
        example=2,
        rollouts=[
            rollout(call([1], [2]), reward=0.0, error="InfraError: gone"),
            rollout(reward=0.0),  # no token ids came back
            rollout(call([1] * 9, [2]), reward=1.0),  # longer than the context
            Rollout(
                reward=1.0,
                steps=[
                    Step(
                        prompt_ids=[1],
                        completion_ids=[2],
                        completion_logprobs=[],
                        completion_mask=[1],
                    )
                ],
                prompt=[],
                completion=[],
            ),
        ],
    )
    batch = read_groups([good, flat, bad], 4, context=8)
    assert {s.meta["policy_step"] for s in batch.sequences} == {4}
    prepared = prepare(batch.sequences, step=5)
    batch.settle(prepared.sequences, prepared.dropped_groups)
    assert [s.advantages for s in batch.sequences] == [[0.0, 0.5], [0.0, -0.5]]
    assert batch.dropped == {
        "equal_rewards": 1,
        "error": 1,
        "no_tokens": 1,
        "too_long": 1,
        "malformed": 1,
    }
    assert batch.errors() == ["InfraError: gone"] and not batch.all_failed()
    metrics = batch.metrics()
    assert metrics["verifiers/errors"] == 1 and metrics["env/num_episodes"] == 8
