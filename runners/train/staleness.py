"""How far off policy a step's groups are, and the bound (`max_steps_off_policy`) applied to them.

Policy `s` is the weights after `s` optimizer steps (0: the start). Step `k` trains policy
`k - 1`, so a sequence sampled from policy `s` is `k - 1 - s` steps off policy (0 in a
synchronous loop). A group is as stale as its oldest sequence; groups beyond the bound are
dropped whole (their advantages are relative to each other) and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runners.train.learner import Sequence

# A sequence's meta key: the policy (optimizer steps) that sampled it; absent: not known.
POLICY_STEP = "policy_step"


@dataclass
class Fresh:
    sequences: list[Sequence]  # those kept, in order
    metrics: dict[str, float] = field(default_factory=dict)


def steps_off_policy(step: int, policy_step: int) -> int:
    """How many steps behind the policy step `step` trains a sample of `policy_step` is."""
    return step - 1 - policy_step


def bound(sequences: list[Sequence], step: int, limit: int) -> Fresh:
    """The sequences of groups at most `limit` steps off policy; the groups' staleness (mean
    and max over groups whose policy is known) and the groups dropped, as sampler/ metrics."""
    groups: dict[int, list[Sequence]] = {}
    for sequence in sequences:
        groups.setdefault(sequence.group, []).append(sequence)
    stale: dict[int, int] = {}
    for group, members in groups.items():
        known = [s.meta[POLICY_STEP] for s in members if s.meta.get(POLICY_STEP) is not None]
        if known:
            stale[group] = steps_off_policy(step, min(known))
    dropped = {g for g, n in stale.items() if n > limit}
    kept = [s for s in sequences if s.group not in dropped]
    metrics: dict[str, float] = {"sampler/stale_groups_dropped": float(len(dropped))}
    if stale:
        values = list(stale.values())
        metrics["sampler/steps_off_policy"] = sum(values) / len(values)
        metrics["sampler/steps_off_policy_max"] = float(max(values))
    untagged = len(groups) - len(stale)
    if untagged:
        metrics["sampler/untagged_groups"] = float(untagged)
    return Fresh(kept, metrics)
