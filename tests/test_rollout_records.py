"""Rollout records built from what a step had: a multi-turn episode as the environment's and the
model's turns with their rewards and advantages, a dropped group untrained, the finish reason
from the stop token; an Atropos group split by its mask, its dropped groups untrained, its
messages kept."""

from __future__ import annotations

from runners.atropos.groups import read_batch
from runners.atropos.rollout_records import sequence_records
from runners.episodes.rollouts import Episode, Transition
from runners.train.learner import assign_advantages
from runners.train.loop import sequences_of
from runners.train.rollout_records import episode_records
from tests.support.prepare import prepare

STOP = 99


def decode(tokens: list[int]) -> str:
    return " ".join(f"t{t}" for t in tokens)


def turn(prompt: list[int], action: list[int], reward: float, done: bool) -> Transition:
    return Transition(prompt, action, [-0.5] * len(action), reward, done, {"hits": reward})


def test_episodes_become_records_turn_by_turn() -> None:
    two_turns = Episode(0, 7, [turn([1, 2], [3, STOP], 0.0, False), turn([4], [5, 6], 1.0, True)])
    one_turn = Episode(0, 8, [turn([1, 2], [3, 3], 0.0, True)])
    flat = [Episode(1, 9, [turn([1], [2], 0.5, True)]) for _ in range(2)]  # no signal: dropped
    episodes = [two_turns, one_turn, *flat]
    advantaged = assign_advantages(sequences_of(episodes), "grpo")
    assert advantaged.dropped_groups == 1
    records = episode_records(episodes, advantaged.sequences, decode, [STOP])
    first, second, third, _ = records
    assert [(s.role, s.text) for s in first.segments] == [
        ("env", "t1 t2"),
        ("model", "t3 t99"),
        ("env", "t4"),
        ("model", "t5 t6"),
    ]
    assert first.prompt == "t1 t2" and first.completion == "t3 t99\nt5 t6"
    assert (first.reward, first.advantage, second.advantage) == (1.0, 0.5, -0.5)
    assert [s.reward for s in first.segments if s.role == "model"] == [0.0, 1.0]
    assert first.turns == 2 and first.completion_tokens == 4 and first.prompt_tokens == 2
    assert first.finish_reason == "length" and first.logprob_mean == -0.5
    assert first.metrics == {"hits": 1.0} and first.group == 0 and first.trained
    assert third.advantage is None and not third.trained and third.reward == 0.5
    assert [r.index for r in records] == [0, 1, 2, 3]
    ended = episode_records([Episode(0, 1, [turn([1], [2, STOP], 1.0, True)])], [], decode, [STOP])
    assert ended[0].finish_reason == "stop"


def group(scores: list[float], **extra: object) -> dict[str, object]:
    n = len(scores)
    return {
        "tokens": [[1, 2, 10 + i, STOP] for i in range(n)],
        "masks": [[-100, -100, 10 + i, STOP] for i in range(n)],
        "scores": scores,
        "inference_logprobs": [[0.0, 0.0, -0.25, -0.75] for _ in range(n)],
        **extra,
    }


def test_atropos_groups_become_records_split_by_their_mask() -> None:
    chat = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]] * 2
    groups = [group([1.0, 0.0], messages=chat), group([0.5, 0.5])]  # the second: equal scores
    batch = read_batch(groups, "grpo", None)
    prepared = prepare(batch.sequences)
    batch.settle(prepared.sequences, prepared.dropped_groups)
    records = sequence_records(groups, batch.sequences, decode, [STOP])
    assert [(r.group, r.index, r.reward, r.advantage) for r in records] == [
        (0, 0, 1.0, 0.5),
        (0, 1, 0.0, -0.5),
        (1, 2, 0.5, None),
        (1, 3, 0.5, None),
    ]
    first = records[0]
    assert [(s.role, s.text, s.tokens) for s in first.segments] == [
        ("env", "t1 t2", 2),
        ("model", "t10 t99", 2),
    ]
    assert first.prompt == "t1 t2" and first.completion == "t10 t99"
    assert first.finish_reason == "stop" and first.logprob_mean == -0.5
    assert first.messages == chat[0] and records[2].messages is None
    assert first.trained and not records[2].trained
    assert sum(r.reward or 0 for r in records) / 4 == batch.reward_mean()
