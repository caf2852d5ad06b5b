"""The learner (runners/train/learner.py) against hand-worked numbers: each advantage mode,
dropping, std scaling, the seeded ReBN subset, the environment's own advantages; the datum's
shape; the sampler/learner KL; and one real step on the local backend (tiny-random)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tinker import types

from runners.train.learner import (
    Sequence,
    assign_advantages,
    batch_normalised,
    corrected_share,
    datum,
    group_relative,
    kl_metrics,
)


def seq(
    reward: float,
    group: int,
    sample: int,
    prompt: int = 2,
    out: int = 2,
    advantages: list[float] | None = None,
) -> Sequence:
    """`prompt` untrained tokens, then `out` trained ones with sampler logprobs -0.1, -0.2..."""
    n = prompt + out
    return Sequence(
        tokens=list(range(10, 10 + n)),
        trained=[False] * prompt + [True] * out,
        logprobs=[0.0] * prompt + [-0.1 * (i + 1) for i in range(out)],
        reward=reward,
        group=group,
        sample=sample,
        advantages=advantages,
    )


def last(sequences: list[Sequence]) -> list[float]:
    """Each sequence's advantage on its last (trained) token."""
    return [s.advantages[-1] for s in sequences if s.advantages is not None]


def test_grpo_centres_each_group_on_the_trained_tokens_and_drops_flat_ones() -> None:
    batch = [
        seq(1.0, group=0, sample=0),
        seq(0.2, group=1, sample=1),
        seq(0.0, group=0, sample=2),
        seq(0.2, group=1, sample=3),  # group 1: every return equal
        seq(0.7, group=2, sample=4),  # group 2: one sample, nothing to compare with
    ]
    got = assign_advantages(batch, "grpo")
    assert got.dropped_groups == 2
    assert [s.sample for s in got.sequences] == [0, 2]
    assert got.sequences[0].advantages == pytest.approx([0.0, 0.0, 0.5, 0.5])
    assert got.sequences[1].advantages == pytest.approx([0.0, 0.0, -0.5, -0.5])


def test_grpo_sums_a_samples_turns_and_scales_by_the_groups_std() -> None:
    # Sample 0 has two turns (rewards 0 and 1: return 1), sample 1 one turn (return 0.5),
    # sample 2 one turn (return 0): mean 0.5, population std sqrt(1/6).
    batch = [
        seq(0.0, 0, 0),
        seq(1.0, 0, 0),
        seq(0.5, 0, 1),
        seq(0.0, 0, 2),
    ]
    std = (1 / 6) ** 0.5
    again = [seq(s.reward, 0, s.sample) for s in batch]
    plain = assign_advantages(batch, "grpo")
    assert last(plain.sequences) == pytest.approx([0.5, 0.5, 0.0, -0.5])
    scaled = assign_advantages(again, "grpo", scale_by_std=True)
    want = [x / std for x in (0.5, 0.5, 0.0, -0.5)]
    assert last(scaled.sequences) == pytest.approx(want, rel=1e-5)


def test_rebn_z_scores_discounted_returns_per_turn_across_the_batch() -> None:
    # Sample 0: rewards 0, 1 -> returns 0.5, 1.0 (gamma 0.5); sample 1: 0.0. Mean 0.5,
    # sample std 0.5 -> z = 0, 1, -1; grouping does not matter.
    batch = [seq(0.0, 0, 0), seq(1.0, 0, 0), seq(0.0, 1, 1)]
    got = assign_advantages(batch, "rebn", gamma=0.5)
    assert last(got.sequences) == pytest.approx([0.0, 1.0, -1.0], abs=1e-6)
    assert got.dropped_groups == 0
    flat = assign_advantages([seq(1.0, 0, 0), seq(1.0, 1, 1), seq(1.0, 1, 2)], "rebn")
    assert flat.sequences == [] and flat.dropped_groups == 2


def test_rebn_keeps_a_seeded_subset_of_limit() -> None:
    def batch() -> list[Sequence]:
        return [seq(float(i), i, i) for i in range(10)]

    one = assign_advantages(batch(), "rebn", limit=4, seed=3)
    again = assign_advantages(batch(), "rebn", limit=4, seed=3)
    other = assign_advantages(batch(), "rebn", limit=4, seed=4)
    assert len(one.sequences) == 4
    assert [s.sample for s in one.sequences] == [s.sample for s in again.sequences]
    assert [s.sample for s in one.sequences] != [s.sample for s in other.sequences]
    # The advantages are the whole batch's z-scores, not the subset's.
    everything = assign_advantages(batch(), "rebn")
    by_sample = {s.sample: s.advantages for s in everything.sequences}
    assert all(s.advantages == by_sample[s.sample] for s in one.sequences)
    # grpo's batch is counted in groups: no subset.
    grpo = [seq(float(i % 2), 0, i) for i in range(6)]
    assert len(assign_advantages(grpo, "grpo", limit=1).sequences) == 6


def test_the_environments_own_advantages_pass_through_masked() -> None:
    own = seq(0.3, 0, 0, advantages=[9.0, 9.0, 2.0, 3.0])
    same = seq(0.3, 0, 1, advantages=[0.0, 0.0, 0.0, 0.0])
    computed = [seq(1.0, 1, 2), seq(0.0, 1, 3)]
    got = assign_advantages([own, same, *computed], "grpo")
    assert got.dropped_groups == 0  # equal rewards, but their advantages are given
    assert got.sequences[0].advantages == [0.0, 0.0, 2.0, 3.0]
    assert last(got.sequences[2:]) == pytest.approx([0.5, -0.5])
    # rebn normalises only the sequences without their own.
    rebn = assign_advantages(
        [seq(0.0, 0, 0, advantages=[0.0, 0.0, 5.0, 5.0]), seq(1.0, 1, 1), seq(0.0, 1, 2)], "rebn"
    )
    assert last(rebn.sequences) == pytest.approx([5.0, 0.70710678, -0.70710678], rel=1e-5)


def test_the_pure_maths() -> None:
    assert group_relative([1.0, 0.0], scale_by_std=False) == [0.5, -0.5]
    assert group_relative([1.0, 1.0], scale_by_std=False) is None
    assert group_relative([1.0], scale_by_std=False) is None
    assert batch_normalised([1.0]) is None and batch_normalised([2.0, 2.0]) is None
    assert batch_normalised([0.0, 1.0]) == pytest.approx([-0.70710678, 0.70710678])


def test_datum_shifts_by_one_and_fills_the_trained_targets_only() -> None:
    s = seq(1.0, 0, 0, prompt=3, out=2, advantages=[0.0, 0.0, 0.0, 0.7, 0.7])
    s.logprobs = [1.0, 1.0, 1.0, -0.1, -0.2]  # what the prompt carries is never used
    made = datum(s)
    assert made is not None
    assert made.model_input.to_ints() == [10, 11, 12, 13]
    inputs = made.loss_fn_inputs
    assert inputs["target_tokens"].tolist() == [11, 12, 13, 14]
    assert inputs["target_tokens"].dtype == "int64"
    assert inputs["logprobs"].tolist() == pytest.approx([0.0, 0.0, -0.1, -0.2])
    assert inputs["advantages"].tolist() == pytest.approx([0.0, 0.0, 0.7, 0.7])
    assert inputs["advantages"].dtype == "float32"
    # The first token is never a target: trained alone, it trains nothing.
    assert datum(Sequence([5, 6], [True, False], [0.0, 0.0], 0.0, 0, 0, [0.0, 0.0])) is None


def test_kl_metrics_compare_the_sampler_and_the_learner_on_trained_targets() -> None:
    s = seq(1.0, 0, 0, prompt=2, out=2)  # targets: 11 (prompt), 12 and 13 (trained)
    learner = {"logprobs": types.TensorData.from_numpy(np.array([-5.0, -0.3, -0.1]))}
    got = kl_metrics([s], [learner])
    # Sampler -0.1, -0.2 vs learner -0.3, -0.1: differences 0.2 and -0.1.
    assert got["train/kl_sample_train_v1"] == pytest.approx(0.05)
    assert got["train/kl_sample_train_v2"] == pytest.approx(0.5 * (0.04 + 0.01) / 2)
    assert got["sampler/token_entropy"] == pytest.approx(0.15)
    # The mismatch: learner over sampler ratios exp(-0.2) and exp(0.1); k3 = r - 1 - log r.
    k3 = [math.exp(x) - 1 - x for x in (-0.2, 0.1)]
    assert got["mismatch/k3"] == pytest.approx(sum(k3) / 2)
    assert got["mismatch/abs_max"] == pytest.approx(0.2)
    assert got["mismatch/abs_mean"] == pytest.approx(0.15)
    assert got["mismatch/ratio_outside"] == 0.0
    assert kl_metrics([], []) == {}


def test_the_share_the_correction_touched_comes_from_the_losss_counts() -> None:
    metrics = {"loss:sum": 1.0, "mismatch_tokens:sum": 200.0, "corrected_tokens:sum": 3.0}
    assert corrected_share(metrics) == {"mismatch/corrected": 0.015}
    assert corrected_share({"loss:sum": 1.0}) == {}  # hosted Tinker says nothing of it
