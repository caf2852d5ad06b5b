"""A runner whose environment samples through the run's inference face (Atropos, verifiers):
the face pauses while the local backend trains, and serves each step's weights once trained."""

from __future__ import annotations

import contextlib
from typing import Protocol, TypeVar

from runners.doors.face import InferenceFace
from runners.train.run_base import RunContext, RunnerBase


class HasFace(Protocol):
    face: InferenceFace


F = TypeVar("F", bound=HasFace)  # the driver's part of the run: it holds the face
B = TypeVar("B")


class FaceRunner(RunnerBase[F, B]):
    def training_window(self, run: RunContext[F]) -> contextlib.AbstractContextManager[None]:
        # The local backend trains on what also samples: one at a time.
        local = run.backend == "local"
        return run.data.face.paused() if local else contextlib.nullcontext()

    async def publish(self, run: RunContext[F], step: int) -> None:
        run.data.face.set_sampler(await self.snapshot(run.training), step)
