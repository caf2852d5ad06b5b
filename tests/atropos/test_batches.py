"""A trajectory API batch into training data (runners.atropos.groups), and what the
environment says about itself (runners.atropos.watch): advantages, masks, logprobs, the
groups dropped and why."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from runners.atropos.groups import MASKED, Batch, UnusableData, read_batch
from runners.atropos.watch import EvalWatch, LogWatch, MetricsTap
from runners.train.learner import datum
from tests.support.prepare import prepare


def settled(
    groups: list[dict[str, Any]], advantage: Any, scale_by_std: bool, context: int | None
) -> Batch:
    """The batch as a run trains it: read, the run's advantages, the environment's overrides."""
    batch = read_batch(groups, advantage, context)
    prepared = prepare(batch.sequences, advantage, scale_by_std)
    batch.settle(prepared.sequences, prepared.dropped_groups)
    return batch


def group(scores: list[float], prompt: int = 3, out: int = 2, **extra: Any) -> dict[str, Any]:
    """A managed_server-shaped group: prompt tokens masked, logprobs 1.0 there."""
    n = len(scores)
    tokens = [[10 + i] * prompt + [20 + i] * out for i in range(n)]
    masks = [[MASKED] * prompt + [20 + i] * out for i in range(n)]
    logprobs = [[1.0] * prompt + [-0.1 * (j + 1) for j in range(out)] for _ in range(n)]
    return {
        "tokens": tokens,
        "masks": masks,
        "scores": scores,
        "inference_logprobs": logprobs,
        **extra,
    }


def test_grpo_advantages_from_scores_on_the_trained_tokens_only() -> None:
    batch = settled([group([1.0, 0.0, 0.5])], "grpo", False, None)
    assert [s.advantages[-1] for s in batch.sequences] == pytest.approx([0.5, -0.5, 0.0])
    for sequence in batch.sequences:
        assert sequence.advantages[:3] == [0.0, 0.0, 0.0]  # the prompt
        assert sequence.trained == [False] * 3 + [True] * 2
    d = datum(batch.sequences[0])
    assert d is not None
    assert d.model_input.to_ints() == [10, 10, 10, 20]
    assert d.loss_fn_inputs["target_tokens"].tolist() == [10, 10, 20, 20]
    # Targets 2 and 3 are the output: the sampler's logprobs and the advantage sit there.
    assert d.loss_fn_inputs["logprobs"].tolist() == pytest.approx([0.0, 0.0, -0.1, -0.2])
    assert d.loss_fn_inputs["advantages"].tolist() == pytest.approx([0.0, 0.0, 0.5, 0.5])


def test_groups_that_teach_nothing_or_do_not_fit_are_dropped_and_counted() -> None:
    groups = [
        group([0.5, 0.5]),  # equal scores
        group([1.0, 0.0], prompt=30),  # 32 tokens, beyond a 16-token context
        {"tokens": [[1, 2]], "masks": [[1, 2]], "scores": [1.0, 0.0]},  # malformed
        group([0.0, 1.0]),
    ]
    batch = settled(groups, "grpo", True, 16)
    assert dict(batch.dropped) == {"equal_scores": 1, "too_long": 1, "malformed": 1}
    assert len(batch.sequences) == 2
    metrics = batch.metrics()
    assert metrics["atropos/groups_received"] == 4 and metrics["atropos/groups_dropped"] == 3
    assert metrics["atropos/dropped/too_long"] == 1
    assert batch.reward_mean() == pytest.approx((0.5 + 0.5 + 0.5 + 0.5) / 4)
    assert metrics["env/percent_correct"] == pytest.approx(3 / 8)
    # Scaled by the group's std (0.5): +-1.
    assert [s.advantages[-1] for s in batch.sequences] == pytest.approx([-1.0, 1.0], abs=1e-4)


def test_rebn_normalises_across_the_batch() -> None:
    batch = settled([group([1.0, 1.0]), group([0.0, 0.0])], "rebn", False, None)
    values = [s.advantages[-1] for s in batch.sequences]
    assert sum(values) == pytest.approx(0.0) and values[0] > 0 > values[-1]
    assert not batch.dropped  # equal within a group, not across the batch


def test_the_environments_own_advantages_and_overrides() -> None:
    own = group([0.3, 0.3], advantages=[[0.0, 0.0, 0.0, 2.0, 3.0], [9.0] * 5])
    own["overrides"] = [{}, {"set_advantage_to_zero": True}]
    batch = settled([own], "grpo", False, None)
    assert batch.sequences[0].advantages == [0.0, 0.0, 0.0, 2.0, 3.0]
    assert batch.sequences[1].advantages == [0.0] * 5


def test_sequences_without_sampler_logprobs_are_left_to_recompute() -> None:
    plain = group([1.0, 0.0])
    del plain["inference_logprobs"]  # a chat_completion environment tokenizes itself
    batch = settled([plain], "grpo", False, None)
    assert [s.logprobs for s in batch.sequences] == [None, None]


def test_made_up_tokens_of_the_dummy_server_fail_loudly() -> None:
    n = 4
    dummy = {
        "tokens": [[5, 6] + list(range(n))] * 2,
        "masks": [[MASKED, MASKED] + list(range(n))] * 2,
        "scores": [1.0, 0.0],
        "inference_logprobs": [[1.0, 1.0] + [-0.5] * n] * 2,
    }
    with pytest.raises(UnusableData, match="DummyManagedServer"):
        settled([dummy], "grpo", False, None)


def test_the_log_says_which_groups_the_environment_dropped(tmp_path: Path) -> None:
    log = tmp_path / "env.log"
    watch = LogWatch(log)
    assert "no dropped group" in watch.why_nothing()
    log.write_text(
        "Scores are the same in a group, skipping...\n"
        "WARNING:atroposlib.envs.base:Token length is too long in a group, skipping...\n"
        "ERROR:root:Error in collect_trajectories: boom at item 3\n"
        "Scores are the same in a gr"  # a line still being written
    )
    assert watch.take() == {
        "atropos/env_dropped/equal_scores": 1.0,
        "atropos/env_dropped/too_long": 1.0,
        "atropos/env_dropped/collect_error": 1.0,
        "atropos/env_dropped": 3.0,
    }
    with log.open("a") as out:
        out.write("oup, skipping...\n")
    assert watch.take()["atropos/env_dropped/equal_scores"] == 1.0
    why = watch.why_nothing()
    assert why.startswith("the environment dropped groups: 2 x every score")
    assert "Last error: ERROR:root:Error in collect_trajectories: boom at item 3" in why


def test_the_environments_wandb_keys_lose_atropos_prefix(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tap = MetricsTap(path, "word_echo")
    assert tap.take() == {}
    lines = [
        {"step": 1, "metrics": {"word_echo_0_train/percent_correct": 0.25, "server_0_x": 1}},
        {"step": 2, "metrics": {"word_echo_0_train/percent_correct": 0.5}},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 3, "met')
    assert tap.take() == {"atropos/train/percent_correct": 0.5, "atropos/server_0_x": 1.0}
    assert tap.take() == {}


def test_evaluations_are_read_when_metrics_json_changes(tmp_path: Path) -> None:
    path = tmp_path / "metrics.json"
    watch = EvalWatch(path)
    assert watch.take() == {}
    path.write_text(json.dumps({"results": {"all": {"eval/percent_correct": 0.5, "acc": 1}}}))
    assert watch.take() == {"eval/percent_correct": 0.5, "eval/acc": 1.0}
    assert watch.take() == {}  # unchanged
    later = time.time() + 5
    path.write_text(json.dumps({"results": {"all": {"eval/percent_correct": 1.0}}}))
    os.utime(path, (later, later))
    assert watch.take() == {"eval/percent_correct": 1.0}
