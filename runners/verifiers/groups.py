"""A step's groups from a verifiers environment as the learner's sequences: each rollout's
model calls merged into one sequence as prime-rl merges them (a call whose prompt extends the
previous call's prompt and completion continues it; another starts a new sequence of the same
sample), the completion tokens trained, the sampler's logprobs kept, the rollout's reward on its
last sequence, each tagged with the policy that sampled it. The run's advantages over each
group come after (RunnerBase.prepare); `Batch.settle` keeps what then trains.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from core.verifiers_wire import Group, Rollout
from runners.train import staleness
from runners.train.learner import Sequence


@dataclass
class Batch:
    groups: list[Group]
    # Read: every usable rollout's; settled: those trained, advantages set.
    sequences: list[Sequence] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)

    def settle(self, advantaged: list[Sequence], dropped_groups: int) -> list[Sequence]:
        """The sequences to train, from those given their advantages (groups without signal
        counted)."""
        if dropped_groups:
            self.dropped["equal_rewards"] += dropped_groups
        self.sequences = [s for s in advantaged if any(s.trained)]
        return self.sequences

    def errors(self) -> list[str]:
        """What the rollouts that failed said (verifiers keeps a rollout's error in it)."""
        return [r.error for g in self.groups for r in g.rollouts if r.error]

    def all_failed(self) -> bool:
        rollouts = sum(len(g.rollouts) for g in self.groups)
        return rollouts > 0 and len(self.errors()) == rollouts

    def rewards(self) -> list[float]:
        return [r.reward for g in self.groups for r in g.rollouts]

    def reward_mean(self) -> float | None:
        rewards = self.rewards()
        return sum(rewards) / len(rewards) if rewards else None

    def metrics(self) -> dict[str, float]:
        rewards = self.rewards()
        out: dict[str, float] = {
            "env/num_groups": float(len(self.groups)),
            "env/num_episodes": float(len(rewards)),
            "verifiers/errors": float(sum(1 for g in self.groups for r in g.rollouts if r.error)),
            "verifiers/truncated": float(
                sum(1 for g in self.groups for r in g.rollouts if r.truncated)
            ),
            **{f"verifiers/dropped/{k}": float(v) for k, v in self.dropped.items()},
        }
        if rewards:
            out["env/reward_min"] = min(rewards)
            out["env/reward_max"] = max(rewards)
        sums: defaultdict[str, list[float]] = defaultdict(list)
        for group in self.groups:
            for rollout in group.rollouts:
                for name, value in rollout.metrics.items():
                    sums[name].append(value)
        out.update({f"env/{k}": sum(v) / len(v) for k, v in sums.items()})
        trained = [sum(s.trained) for s in self.sequences]
        if trained:
            out["sampler/action_num_tokens"] = sum(trained) / len(trained)
        return out


def read_groups(groups: list[Group], policy_step: int, context: int | None) -> Batch:
    """The groups' sequences, sampled by `policy_step`; rollouts that failed or do not fit
    the model are left out, counted by reason."""
    batch = Batch(groups)
    sequences: list[Sequence] = []
    sample = 0
    for group_index, group in enumerate(groups):
        for rollout in group.rollouts:
            why: str | None
            try:
                made = rollout_sequences(rollout, group_index, sample)
            except ValueError:
                made, why = [], "malformed"
            else:
                why = _unusable(rollout, made, context)
            sample += 1
            if why is not None:
                batch.dropped[why] += 1
                continue
            sequences += made
    for sequence in sequences:
        sequence.meta[staleness.POLICY_STEP] = policy_step
    batch.sequences = sequences
    return batch


def _unusable(rollout: Rollout, made: list[Sequence], context: int | None) -> str | None:
    if rollout.error is not None:
        return "error"
    if not made:
        return "no_tokens"  # the face's answers carried no token ids
    if context is not None and any(len(s.tokens) > context for s in made):
        return "too_long"
    return None


def rollout_sequences(rollout: Rollout, group: int, sample: int) -> list[Sequence]:
    """The rollout's model calls as sequences of one sample: merged while each call's prompt
    extends what came before; the reward on the last."""
    out: list[Sequence] = []
    for step in rollout.steps:
        prompt, completion = step.prompt_ids, step.completion_ids
        mask = [m != 0 for m in step.completion_mask] or [True] * len(completion)
        logprobs = step.completion_logprobs
        if len(mask) != len(completion) or len(logprobs) != len(completion):
            raise ValueError(
                f"a model call's {len(completion)} completion tokens came with "
                f"{len(mask)} mask values and {len(logprobs)} logprobs"
            )
        current = out[-1] if out else None
        if current is not None and prompt[: len(current.tokens)] == current.tokens:
            added = prompt[len(current.tokens) :]
            current.tokens += added + completion
            current.trained += [False] * len(added) + mask
            assert current.logprobs is not None
            current.logprobs += [0.0] * len(added) + logprobs
            continue
        out.append(
            Sequence(
                tokens=list(prompt) + list(completion),
                trained=[False] * len(prompt) + mask,
                logprobs=[0.0] * len(prompt) + list(logprobs),
                reward=0.0,
                group=group,
                sample=sample,
            )
        )
    if out:
        out[-1].reward = rollout.reward
    return out
