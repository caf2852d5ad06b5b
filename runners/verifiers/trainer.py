"""A verifiers run: the runner plays the part prime-rl's orchestrator and trainer play for a
verifiers environment (docs/verifiers.md).

It serves the run's current policy on a loopback inference face (the one Atropos samples from,
with vLLM's token ids), starts the environment's driver in the verifiers interpreter
(driver.py), and then for each step: asks the driver for `groups_per_step` groups of
`group_size` rollouts (examples taken in order from the dataset, shuffled by the run's seed;
sampled from the newest policy), reads their model calls as the learner's sequences with the
sampler's logprobs (groups.py), takes the RL step every run takes (RunnerBase: group
advantages, the learner), and swaps the policy the face serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.models import RunStatus
from core.run_folder import RunFolder
from core.settings import Settings
from core.spec import RunSpec
from core.verifiers import VerifiersRunConfig
from core.verifiers_wire import Group
from runners.doors.face import DRAIN_S, InferenceFace, serving
from runners.doors.face_runner import FaceRunner
from runners.doors.requests import SamplingDefaults
from runners.train.learner import Sequence
from runners.train.report import timed
from runners.train.run_base import Batch, Prepared, Report, RunContext, Stepped
from runners.verifiers.driver import Driver, DriverConfig, EnvironmentFailed, sampling_args
from runners.verifiers.groups import Batch as Rollouts
from runners.verifiers.groups import read_groups
from runners.verifiers.records import rollout_records

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from runners.backends.surface import TrainingClient

log = logging.getLogger("runner")


@dataclass
class Data:
    face: InferenceFace
    driver: Driver
    context: int | None


Run = RunContext[Data]


class VerifiersTrainer(FaceRunner[Data, Rollouts]):
    def __init__(self, settings: Settings, folder: RunFolder, spec: RunSpec, engine: Engine):
        config = VerifiersRunConfig.model_validate(spec.config)
        super().__init__(settings, folder, spec.run_id, engine, config, config.total_steps)
        self.config = config
        self.spec = spec
        self.work = folder.path / "verifiers"

    def describe(self) -> str:
        return f"verifiers environment {self.spec.environment} ({self.spec.env_file})"

    async def open_data(
        self, backend: str, training: TrainingClient, exits: contextlib.AsyncExitStack
    ) -> Data:
        """The face serving the current policy and the environment's driver; the driver ends
        first, then the face (after what still samples)."""
        from core.model_names import context_length
        from runners.episodes.render import Renderer
        from runners.models.loading import load_tokenizer

        cfg = self.config
        models = self.settings.models_dir
        tokenizer = load_tokenizer(cfg.model_name, models)
        context = context_length(cfg.model_name, models) if backend == "local" else None
        face = InferenceFace(
            tokenizer,
            SamplingDefaults(cfg.max_tokens, cfg.temperature, cfg.top_p, cfg.top_k),
            context,
            Renderer(tokenizer, "plain").stop_token_ids(),
            cfg.model_name,
            door="verifiers",
        )
        face.set_sampler(await self.snapshot(training), self.step)
        face_url = await exits.enter_async_context(serving(face))
        exits.push_async_callback(face.drain, DRAIN_S)
        driver = await self._start_driver(exits, face_url, face.key)
        return Data(face, driver, context)

    async def _start_driver(
        self, exits: contextlib.AsyncExitStack, face_url: str, key: str
    ) -> Driver:
        """The environment's driver in the verifiers interpreter (stopped when the run ends),
        once it has loaded the environment."""
        cfg = self.config
        driver = Driver.start(
            self.settings,
            DriverConfig.of(
                self.spec.sources()[self.spec.environment],
                cfg.env_args(),
                f"{face_url}/v1",
                cfg.model_name,
                cfg.seed,
                self.settings.models_dir,
            ),
            self.work,
            key,
        )
        exits.push_async_callback(asyncio.to_thread, driver.stop)
        ready = await self._until_stopped(
            driver.wait_ready(self.settings.verifiers_start_timeout_s)
        )
        log.info(
            "environment %s loaded (%s): %s examples to train on, %s to evaluate",
            self.spec.environment,
            ready.env_type,
            ready.examples,
            ready.eval_examples,
        )
        return driver

    async def next_batch(self, run: Run, step: int, times: dict[str, float]) -> list[Group]:
        with timed(times, "sample"):
            return await self._until_stopped(self._groups(run.data, step))

    def read(self, run: Run, step: int, drawn: list[Group]) -> Batch[Rollouts]:
        # Sampled on policy: by the weights the step before left.
        batch = read_groups(drawn, step - 1, run.data.context)
        errors = batch.errors()
        if batch.all_failed():
            raise EnvironmentFailed(
                f"every rollout of step {step} failed in the environment; the first "
                f"said: {errors[0]}"
            )
        if errors:
            log.warning(
                "step %d: %d of %d rollouts failed in the environment and are left out "
                "of training; the first said: %s",
                step,
                len(errors),
                len(batch.rewards()),
                errors[0],
            )
        return Batch(batch, batch.sequences, 0, train_empty=False)

    async def settle(self, run: Run, batch: Batch[Rollouts], prepared: Prepared) -> list[Sequence]:
        return batch.own.settle(prepared.sequences, prepared.dropped_groups)

    async def report(self, run: Run, done: Stepped[Rollouts]) -> Report:
        batch = done.batch.own
        stats = run.data.face.stats.take()
        metrics = {**batch.metrics(), **done.train_metrics, **stats, **done.times}
        return Report(metrics, batch.reward_mean(), lambda: rollout_records(batch))

    async def _groups(self, data: Data, step: int) -> list[Group]:
        """This step's groups, played at once: examples (step-1)*groups_per_step onwards."""
        cfg = self.config
        first = (step - 1) * cfg.groups_per_step
        sampling = sampling_args(cfg.max_tokens, cfg.temperature, cfg.top_p, cfg.top_k)
        return list(
            await asyncio.gather(
                *(
                    data.driver.roll(first + i, cfg.group_size, sampling)
                    for i in range(cfg.groups_per_step)
                )
            )
        )

    async def tear_down(self, run: Run, status: RunStatus) -> None:
        """The driver stops first (nothing more is needed of it), then the last checkpoint and
        W&B as for any run."""
        await asyncio.to_thread(run.data.driver.stop)
        await super().tear_down(run, status)
