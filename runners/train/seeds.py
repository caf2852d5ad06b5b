"""Every seed a run derives from its config's `seed`, in one place: each use draws from a
stream of its own, and a run repeats with the same seed (the formulas are the ones runs have
always used, so earlier runs repeat too)."""

from __future__ import annotations

from dataclasses import dataclass

EVAL_STEPS = 10_000_000  # an evaluation samples as a step this far on would: its own stream


@dataclass(frozen=True)
class RunSeeds:
    seed: int  # the run config's

    def tasks(self, step: int) -> int:
        """Which tasks (environment seeds) step `step` plays."""
        return self.seed * 1_000_003 + step

    def sampling(self, step: int) -> int:
        """The first sampling seed of step `step`: each completion counts up from it, and the
        next step starts 100,003 further on."""
        return (self.seed * 7_919 + step) * 100_003

    def evaluation(self, step: int) -> int:
        """The first sampling seed of the evaluation after step `step`."""
        return self.sampling(EVAL_STEPS + step)

    def subset(self, step: int) -> int:
        """Which sequences a ReBN step keeps when it has more than its batch size."""
        return self.seed + step
