"""What every run's runner does around its loop, whatever it trains on (our environments, or an
Atropos or verifiers environment in processes of its own): `open_run`, the step loop and its
SIGTERM stop, checkpoints, and the one step body every driver's batches go through:

    driver: next_batch (sampled or taken; its wait timed) -> read: Batch (the learner's sequences)
    -> prepare: the staleness bound, then the advantages over what it kept
    -> driver: settle (what trains of those) -> driver's training window: train, publish
    -> driver: report (metrics, rollouts, example, evaluations) -> checkpoint -> driver: after_step
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from core import lifecycle, loss_config
from core.models import RunStatus
from core.run_folder import RunFolder
from core.settings import Settings
from core.training_config import TrainingConfig
from runners.episodes.policy import bounded
from runners.train import staleness
from runners.train.learner import Sequence, assign_advantages, train_on
from runners.train.report import timed
from runners.train.resume import loadable_state
from runners.train.run_hosts import RunHosts
from runners.train.scorers import Scorers, open_scorers

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from tinker import types

    from core.rollouts import RolloutRecord
    from runners.backends.surface import SamplingClient, ServiceClient, TrainingClient
    from runners.train.report import Reporter

log = logging.getLogger("runner")
T = TypeVar("T")
D = TypeVar("D")  # a driver's own part of its run: where its training data comes from
B = TypeVar("B")  # a driver's own form of a step's batch, which its hooks read back


@dataclass
class RunContext(Generic[D]):
    """What a run's steps use, opened once by `RunnerBase.open_run` before the first step."""

    backend: str  # the one the config resolved to: "local" or "tinker"
    training: TrainingClient
    reporter: Reporter
    adam: types.AdamParams
    data: D  # the driver's own (`RunnerBase.open_data`)
    # What is folded into the advantages besides the reward (None: nothing).
    scorers: Scorers | None = None


@dataclass
class Prepared:
    """A step's sequences ready for the learner: the groups the staleness bound kept, with
    their advantages (in training order), what was dropped, and the groups' staleness."""

    sequences: list[Sequence]
    dropped_groups: int  # groups left out for want of signal (their rewards all equal)
    off_policy: dict[str, float]  # sampler/ metrics of the staleness bound


@dataclass
class Batch(Generic[B]):
    """A step's batch as its driver hands it to the step body: the learner's sequences, how
    the body treats them, and the driver's own form of the batch (`own`) for its later hooks."""

    own: B
    sequences: list[Sequence]
    bound: int  # the staleness bound: how many steps off policy a group may be
    rebn_limit: int | None = None  # rebn: the transitions a step keeps (a seeded subset)
    seed: int = 0
    train_empty: bool = True  # False: a step left with no sequences takes no learner step


@dataclass
class Stepped(Generic[B]):
    """What a step did, for its driver's report."""

    step: int
    batch: Batch[B]
    prepared: Prepared
    trained: list[Sequence]  # what the learner took: `prepared`'s, as the driver settled them
    train_metrics: dict[str, float]
    times: dict[str, float]  # time/*: the step's, its training's and the driver's own


@dataclass
class Report:
    """A step's record as its driver words it; the step body records it, in this order."""

    metrics: dict[str, float]
    reward: float | None  # the step's mean reward (None: no sample came back)
    records: Callable[[], list[RolloutRecord]]  # its rollouts, built off the training path
    # Whether the rollouts keep the step's env/ metrics beside them (the native loop's do not).
    metrics_with_rollouts: bool = True
    example: str | None = None  # one sample in a line for the log
    evals: dict[str, float] | None = None  # an evaluation that finished during the step


class Stopped(Exception):
    """SIGTERM arrived: wind down with a checkpoint."""


class RunnerBase(Generic[D, B]):
    """A run's steps from its current one to `total_steps`, each by `train_step`; a driver
    (`D`: its part of the run, `B`: its form of a step's batch) hands in batches and hooks."""

    def __init__(
        self,
        settings: Settings,
        folder: RunFolder,
        run_id: str,
        engine: Engine,
        config: TrainingConfig,
        total_steps: int,
    ) -> None:
        self.settings = settings
        self.folder = folder
        self.run_id = run_id
        self.engine = engine
        self.training_config = config
        self.total_steps = total_steps
        self.stop_event = asyncio.Event()
        self.step = 0
        # The step of the last checkpoint this attempt holds (or resumed from): a stop right
        # after a periodic save must not save the same name again (Tinker refuses that).
        self.saved_step: int | None = None
        self.hosts = RunHosts(settings, config)  # beside its first (sample_hosts, num_devices)

    async def run(self) -> RunStatus:
        # What the run opens is closed when it ends, however it ends (a failure half-way
        # through `open_run` included), in the reverse order of opening.
        async with contextlib.AsyncExitStack() as exits:
            run = await self.open_run(exits)
            status = RunStatus.succeeded
            try:
                while self.step < self.total_steps:
                    if self.stop_event.is_set():
                        raise Stopped
                    await self.train_step(run, self.step + 1)
            except Stopped:
                log.info("stop requested: stopping after step %s", self.step)
                status = RunStatus.stopped
            await self.tear_down(run, status)
        return status

    def describe(self) -> str:
        """What the run trains on, for its first log line."""
        raise NotImplementedError

    async def open_data(
        self, backend: str, training: TrainingClient, exits: contextlib.AsyncExitStack
    ) -> D:
        """The driver's own part of the run; what it starts, it leaves to `exits` to end."""
        raise NotImplementedError

    # The driver's hooks into a step ----------------------------------------------------------

    async def next_batch(self, run: RunContext[D], step: int, times: dict[str, float]) -> Any:
        """Step `step`'s batch as the driver draws it (sampled, or taken from where it was
        sampled); what the wait took, in `times` under the driver's own time/ names."""
        raise NotImplementedError

    def read(self, run: RunContext[D], step: int, drawn: Any) -> Batch[B]:
        """The drawn batch as the learner's sequences (timed as training)."""
        raise NotImplementedError

    async def settle(
        self, run: RunContext[D], batch: Batch[B], prepared: Prepared
    ) -> list[Sequence]:
        """What trains of the prepared sequences."""
        return prepared.sequences

    def training_window(self, run: RunContext[D]) -> contextlib.AbstractContextManager[None]:
        """Held while the learner trains and the new weights are published."""
        return contextlib.nullcontext()

    async def publish(self, run: RunContext[D], step: int) -> None:
        """The weights step `step` trained, to what samples (in the training window)."""

    async def report(self, run: RunContext[D], done: Stepped[B]) -> Report:
        """What the step records (after it trained): its metrics, rollouts, example, evals."""
        raise NotImplementedError

    async def after_step(self, run: RunContext[D], step: int) -> None:
        """What follows a step once it is recorded and checkpointed."""

    # Set-up --------------------------------------------------------------------------------

    async def open_run(self, exits: contextlib.AsyncExitStack) -> RunContext[D]:
        """The backend the config asks for (resolved: tinker with a key, else local), the
        reporter, a training client (fresh or resumed), the optimizer's settings and the
        driver's data."""
        from tinker import types

        from runners.backends.factory import create_service, resolve_backend, run_engine
        from runners.train.report import Reporter

        cfg = self.training_config
        backend = resolve_backend(cfg.backend, self.settings)
        log.info(
            "run %s: %s on %s backend, model %s",
            self.run_id,
            self.describe(),
            backend,
            cfg.model_name,
        )
        reporter = Reporter(self.engine, self.settings, self.run_id, self.folder, cfg)
        checkpoints = self.folder.path / "checkpoints"
        where = run_engine(cfg.engine, self.settings) if backend == "local" else "private"
        if backend == "local" and where == "shared" and self.hosts.wanted > 1:
            service = self.hosts.open(
                self.run_id,
                checkpoints,
                cfg.model_name,
                lambda placed: reporter.meter.wrap(placed, backend),
            )
        else:
            created = create_service(
                backend,
                self.settings,
                checkpoints,
                engine=where,
                client=self.run_id,
                base_model=cfg.model_name,
            )
            service = reporter.meter.wrap(created, backend)
        exits.callback(reporter.settle_cost)  # the run's last seconds, however it ends
        training = await self.open_training(service, reporter)
        adam = types.AdamParams(learning_rate=cfg.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8)
        scorers = await open_scorers(
            cfg, service, training, self.engine, self.settings.backend_call_timeout_s
        )
        data = await self.open_data(backend, training, exits)
        return RunContext(backend, training, reporter, adam, data, scorers)

    async def open_training(self, service: ServiceClient, reporter: Reporter) -> TrainingClient:
        """A training client: fresh, or from the checkpoint this attempt resumes (a resume of
        this run, or the config's resume_from, as a fork has); W&B started."""
        cfg = self.training_config
        own_resume = self.folder.resume_point()  # a new attempt of this run
        wanted = own_resume.state_path if own_resume else cfg.resume_from
        if wanted is None:

            async def made(on: ServiceClient) -> TrainingClient:
                return await self._admitted(
                    lambda: on.create_lora_training_client(
                        base_model=cfg.model_name, rank=cfg.lora_rank, seed=cfg.seed
                    ),
                    "create_lora_training_client",
                )

        else:
            wanted_step = own_resume.step if own_resume else step_from_name(wanted)
            state_path, self.step = loadable_state(wanted, wanted_step)
            if own_resume and self.step != wanted_step:
                lifecycle.rewind(self.engine, self.run_id, self.step)
            self.saved_step = self.step
            log.info("resuming from %s at step %s", state_path, self.step)

            async def made(on: ServiceClient) -> TrainingClient:
                return await self._admitted(
                    lambda: on.create_training_client_from_state_with_optimizer(state_path),
                    "resume",
                )

        training = await self.hosts.training(made, service, self.folder.path)
        # Our own earlier attempt logged under this run's W&B id: rewind it to the checkpoint.
        reporter.start_wandb(resume_step=self.step if own_resume else None)
        return training

    # The RL step ---------------------------------------------------------------------------

    async def train_step(self, run: RunContext[D], step: int) -> None:
        """One step, whatever the driver: its batch, prepared, trained, recorded, saved."""
        times: dict[str, float] = {}
        with timed(times, "step"):
            drawn = await self.next_batch(run, step, times)
            with timed(times, "train"):
                batch = self.read(run, step, drawn)
                prepared = self.prepare(
                    batch.sequences,
                    step,
                    batch.bound,
                    self.keep_flat_groups(run),
                    rebn_limit=batch.rebn_limit,
                    seed=batch.seed,
                )
                trained = await self.settle(run, batch, prepared)
                with self.training_window(run):
                    train = trained or batch.train_empty
                    train_metrics = await self.train(run, trained) if train else {}
                    await self.publish(run, step)
        self.step = step
        report = await self.report(
            run, Stepped(step, batch, prepared, trained, train_metrics, times)
        )
        with_rollouts = report.metrics if report.metrics_with_rollouts else None
        run.reporter.rollouts(step, report.records, with_rollouts)
        run.reporter.step(step, self.total_steps, report.metrics, report.reward)
        if report.example:
            print(report.example, flush=True)
        if report.evals:
            run.reporter.eval(step, report.evals)
        if self.checkpoint_due(step):
            await self.checkpoint(run)
        await self.after_step(run, step)

    def prepare(
        self,
        sequences: list[Sequence],
        step: int,
        bound: int,
        keep_flat: bool,
        *,
        rebn_limit: int | None = None,
        seed: int = 0,
    ) -> Prepared:
        """The groups at most `bound` steps off policy (dropped whole, before the advantages:
        ReBN normalises over the batch it trains), then the run's advantages over them
        (`rebn_limit`: the transitions a step keeps, a `seed`ed subset)."""
        cfg = self.training_config
        fresh = staleness.bound(sequences, step, bound)
        advantaged = assign_advantages(
            fresh.sequences,
            cfg.advantage,
            scale_by_std=cfg.scale_advantage_by_std,
            gamma=cfg.gamma,
            limit=rebn_limit,
            seed=seed,
            keep_flat=keep_flat,
        )
        return Prepared(advantaged.sequences, advantaged.dropped_groups, fresh.metrics)

    async def train(self, run: RunContext[D], sequences: list[Sequence]) -> dict[str, float]:
        """One optimizer step on `sequences` (advantages assigned) with the run's loss, after
        the scorers' signals are folded into their advantages; train/*, kl/, teacher/ metrics."""
        cfg = self.training_config
        folded = await run.scorers.fold(sequences) if run.scorers is not None else {}
        metrics = await train_on(
            run.training,
            sequences,
            cfg.loss_fn,
            loss_config.with_rollout_correction(
                cfg.loss_fn, cfg.loss_fn_config, cfg.rollout_correction, run.backend
            ),
            run.adam,
            timeout_s=self.settings.backend_call_timeout_s,
        )
        return {**folded, **metrics}

    def keep_flat_groups(self, run: RunContext[D]) -> bool:
        """Whether groups whose rewards are all equal still train (a teacher scores them)."""
        return run.scorers is not None and run.scorers.keeps_flat_groups

    async def snapshot(self, training: TrainingClient) -> SamplingClient:
        """A sampler of the current weights; one for a loss that reads recorded sequences
        (stable_reinforce) records what it samples."""
        record = loss_config.LOSSES[self.training_config.loss_fn].reads_recorded
        call = (
            training.save_weights_and_get_sampling_client(record_stability_info=True)
            if record
            else training.save_weights_and_get_sampling_client()
        )
        home = await self._call(call, "sampler snapshot")
        return await self.hosts.sampler(training, home)

    # Between steps -------------------------------------------------------------------------

    async def checkpoint(self, run: RunContext[D], final: bool = False) -> None:
        if self.saved_step == self.step:
            log.info("step %s is already checkpointed; nothing new to save", self.step)
            return
        name = f"step-{self.step:06d}"
        state = await self._call(run.training.save_state(name), "save_state")
        sampler = await self._call(run.training.save_weights_for_sampler(name), "save_weights")
        self.saved_step = self.step
        run.reporter.checkpoint(self.step, name, state.path, sampler.path, final=final)

    def checkpoint_due(self, step: int) -> bool:
        every = self.training_config.save_every
        return bool(every) and step % every == 0 and step < self.total_steps

    async def tear_down(self, run: RunContext[D], status: RunStatus) -> None:
        """A last checkpoint (also on a stop) and W&B closed."""
        await self.checkpoint(run, final=status == RunStatus.succeeded)
        run.reporter.finish_wandb()

    # Helpers -------------------------------------------------------------------------------

    async def _call(self, call: Awaitable[T], what: str) -> T:
        return await bounded(call, self.settings.backend_call_timeout_s, what)

    async def _admitted(self, make: Callable[[], Awaitable[T]], what: str) -> T:
        """A training client; while the engine host's memory budget cannot take its base
        model, the run waits (its details saying why) up to RLCS_ENGINE_ADMISSION_WAIT_S,
        then fails with the reason."""
        deadline = time.monotonic() + self.settings.engine_admission_wait_s
        waited = False
        while True:
            try:
                made = await self._call(make(), what)
            except ValueError as exc:
                if "memory budget" not in str(exc) or time.monotonic() >= deadline:
                    raise
                waited = True
                note = f"waiting for room in the engine host's memory: {exc}"
                lifecycle.record_fields(self.engine, self.run_id, details=note)
                log.warning("%s", note)
                await asyncio.sleep(ADMISSION_POLL_S)  # another client's release frees it
                continue
            if waited:
                lifecycle.record_fields(self.engine, self.run_id, details=None)
            return made

    async def _until_stopped(self, work: Awaitable[T]) -> T:
        """Await `work`, abandoning it if SIGTERM arrives first."""
        task = asyncio.ensure_future(work)
        stop = asyncio.create_task(self.stop_event.wait())
        done, _ = await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if task not in done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise Stopped
        return task.result()


ADMISSION_POLL_S = 5.0  # how often a run waiting for the engine host's memory asks again


def step_from_name(path: str) -> int:
    """The step in a checkpoint name like .../step-000050 (0 when the name has none)."""
    tail = path.rstrip("/").split("/")
    for part in reversed(tail):
        if part.startswith("step-") and part[5:].isdigit():
            return int(part[5:])
    return 0
