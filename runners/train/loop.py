"""The training runner: `python -m runners.train --run-dir DIR` is what a run is.

It reads DIR/config.json (the RunSpec frozen by the server), records its progress in the
database, and runs the RL loop, one step at a time: take the step's episodes, sampled from the
newest weights by a producer that runs at most `max_steps_off_policy` steps ahead (pipeline.py;
0: sampled after the previous step trained) -> the episodes' turns as the learner's sequences
-> groups too far off policy dropped -> advantages -> forward_backward + optim_step
(runners/train/learner.py) -> record; checkpoints and evaluations between steps; the new
weights go to the producer as the next step starts. SIGTERM ends it cleanly with a checkpoint
of the last trained step.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core import lifecycle
from core.db import make_engine
from core.failures import RunFailure
from core.frameworks import FRAMEWORKS, load
from core.models import RunStatus
from core.procs import process_start_time
from core.run_folder import RunFolder
from core.settings import Settings
from core.spec import RunSpec
from environments.base import EnvConfig
from runners.backends.spread_sampling import spread_metrics
from runners.engine.disk_full import DiskFull, full_errno
from runners.episodes.collection import Collector, concurrency_for
from runners.episodes.policy import SamplerPolicy
from runners.episodes.render import Renderer
from runners.episodes.rollouts import Collected, Episode, mean_return
from runners.episodes.sources import env_context, load_sources
from runners.train import staleness
from runners.train.engine_loss import lost_engine, resume_on_a_new_host
from runners.train.learner import SEQUENCE_ID, TURN, Sequence
from runners.train.pipeline import Pipeline, Produced
from runners.train.report import timed
from runners.train.rollout_records import episode_records
from runners.train.run_base import Batch, Report, RunContext, RunnerBase, Stepped
from runners.train.seeds import RunSeeds

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Engine

    from runners.backends.surface import SamplingClient, TrainingClient

log = logging.getLogger("runner")
STOP_POLL_S = 1.0  # how often the runner reads whether a stop was requested

Run = RunContext[Collector]  # a native run's data: the collector over its environments


class Trainer(RunnerBase[Collector, Collected]):
    """A run on our environments (environments.base)."""

    def __init__(self, settings: Settings, folder: RunFolder, spec: RunSpec, engine: Engine):
        sources = load_sources(spec, env_context(settings))
        config: EnvConfig = sources[0].config  # training settings come from it
        super().__init__(settings, folder, spec.run_id, engine, config, config.total_steps)
        self.sources = sources
        self.config = config
        self.seeds = RunSeeds(config.seed)
        self.bound = config.max_steps_off_policy or 0
        self.pipeline: Pipeline[Collected] | None = None
        self.published = 0  # the newest policy (optimizer steps) the producer samples from
        self.spread: dict[int, dict[str, float]] = {}  # each step's sampling over its hosts

    # Set-up --------------------------------------------------------------------------------

    def describe(self) -> str:
        return " + ".join(f"{s.name} (weight {s.weight:g})" for s in self.sources)

    async def open_data(
        self, backend: str, training: TrainingClient, exits: contextlib.AsyncExitStack
    ) -> Collector:
        """The collector (the run's environments, rendered with the model's tokenizer), and
        the producer that samples its steps' episodes, started from the current weights."""
        # A heavy import (transformers), here so `--help` stays light.
        from runners.models.loading import load_tokenizer

        cfg = self.config
        tokenizer = load_tokenizer(cfg.model_name, self.settings.models_dir)
        renderer = Renderer(tokenizer, cfg.prompt_template, cfg.system_prompt)
        collector = Collector(self.sources, renderer, concurrency_for(cfg, backend))
        self.pipeline = Pipeline(
            lambda step, _policy_step, sampler: self.sample(collector, step, sampler),
            bound=self.bound,
            steps=range(self.step + 1, self.total_steps + 1),
        )
        exits.push_async_callback(self.pipeline.close)
        self.pipeline.start(self.step, await self.snapshot(training))
        self.published = self.step
        return collector

    # One step ------------------------------------------------------------------------------

    async def next_batch(self, run: Run, step: int, times: dict[str, float]) -> Produced[Collected]:
        assert self.pipeline is not None
        if step - 1 > self.published:
            # The weights the last step trained, after its checkpoint and evaluation (as the
            # synchronous loop always took them): the producer samples on from them.
            await self.pipeline.publish(step - 1, await self.snapshot(run.training))
            self.published = step - 1
        with timed(times, "wait"):
            produced = await self._until_stopped(self.pipeline.take(step))
        times["time/sample_s"] = produced.sample_s
        return produced

    def read(self, run: Run, step: int, drawn: Produced[Collected]) -> Batch[Collected]:
        collected = drawn.batch
        return Batch(
            collected,
            sequences_of(run.data.usable(collected), drawn.policy_step),
            self.bound,
            rebn_limit=self.config.batch_size,  # rebn: transitions per step
            seed=self.seeds.subset(step),
        )

    async def report(self, run: Run, done: Stepped[Collected]) -> Report:
        collected, prepared, times = done.batch.own, done.prepared, done.times
        if not self.bound:  # a synchronous run: its wait is its sampling, its groups on policy
            times.pop("time/wait_s")
        r = run.data.renderer
        metrics = {
            **run.data.metrics(collected.episodes, "env"),
            "sampler/failed_episodes": collected.failed,
            **self.spread.pop(done.step, {}),
            **done.train_metrics,
            "sampler/dropped_groups": prepared.dropped_groups,
            **(prepared.off_policy if self.bound else {}),
            **times,
        }
        return Report(
            metrics,
            mean_return(collected.episodes),
            lambda: episode_records(
                collected.episodes, prepared.sequences, r.decode, r.stop_token_ids()
            ),
            metrics_with_rollouts=False,
            example=run.data.example(collected.episodes),
        )

    async def after_step(self, run: Run, step: int) -> None:
        every = self.config.steps_per_eval
        if every and step % every == 0:
            await self.evaluate(run)

    async def sample(self, collector: Collector, step: int, sampler: SamplingClient) -> Collected:
        """Step `step`'s episodes (its tasks, its seeds), sampled from `sampler`."""
        policy = self._policy(collector.renderer, sampler, self.seeds.sampling(step))
        collected = await collector.train_batch(policy, step)
        self.spread[step] = spread_metrics(sampler)
        if not collected.episodes and collected.failed:
            raise RuntimeError(
                f"every episode of step {step} failed ({collected.failed}), e.g. "
                f"{collected.errors[0]}"
            )
        if collected.errors:
            log.warning(
                "step %s: %s episode(s) failed, e.g. %s",
                step,
                collected.failed,
                collected.errors[0],
            )
        return collected

    # Between steps -------------------------------------------------------------------------

    async def evaluate(self, run: Run) -> None:
        """Held-out tasks (`eval` split) of every environment of the run, one episode each."""
        sampler = await self._call(
            run.training.save_weights_and_get_sampling_client(), "sampler snapshot"
        )
        policy = self._policy(run.data.renderer, sampler, self.seeds.evaluation(self.step))
        collected = await self._until_stopped(run.data.eval_batch(policy))
        metrics = run.data.metrics(collected.episodes, "eval")
        metrics["eval/failed_episodes"] = collected.failed
        run.reporter.eval(self.step, metrics)

    # Teardown ------------------------------------------------------------------------------

    async def tear_down(self, run: Run, status: RunStatus) -> None:
        """Sampling ahead cancelled; a last checkpoint (also on a stop: of the last trained
        step), a last evaluation when one is due, W&B closed."""
        cfg = self.config
        if self.pipeline is not None:
            await self.pipeline.close()
        await self.checkpoint(run, final=status == RunStatus.succeeded)
        due = cfg.steps_per_eval and cfg.total_steps % cfg.steps_per_eval != 0
        if status == RunStatus.succeeded and due:
            await self.evaluate(run)
        run.reporter.finish_wandb()

    # Helpers -------------------------------------------------------------------------------

    def _policy(self, renderer: Renderer, sampler: SamplingClient, seed: int) -> SamplerPolicy:
        cfg = self.config
        return SamplerPolicy(
            sampler,
            max_tokens=cfg.max_token_length,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop=renderer.stop_token_ids(),
            seed=seed,
            timeout_s=self.settings.backend_call_timeout_s,
        )


def sequences_of(episodes: list[Episode], policy_step: int | None = None) -> list[Sequence]:
    """Each turn as one learner sequence: its prompt, then the action trained on; the turns of
    an episode are one sample of its group. Meta: the policy that sampled it, its sampled
    sequence's id."""
    out = []
    for index, episode in enumerate(episodes):
        for turn, t in enumerate(episode.transitions):
            prompt, action = len(t.prompt_tokens), len(t.action_tokens)
            out.append(
                Sequence(
                    tokens=t.prompt_tokens + t.action_tokens,
                    trained=[False] * prompt + [True] * action,
                    logprobs=[0.0] * prompt + [float(x) for x in t.action_logprobs],
                    reward=t.reward,
                    group=episode.group,
                    sample=index,
                    meta={
                        TURN: (index, turn),
                        staleness.POLICY_STEP: policy_step,
                        SEQUENCE_ID: t.sequence_id,
                    },
                )
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one training run from its folder.")
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "urllib3", "filelock", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    settings = Settings()
    folder = RunFolder(args.run_dir.resolve())
    folder.adopt_carried(settings.run_spec, settings.resume_point)
    spec = folder.spec()
    engine = make_engine(settings.db_url)
    pid = os.getpid()
    if not lifecycle.record_running(engine, spec.run_id, pid, process_start_time(pid)):
        # Stopped (or settled) before this process got going: nothing to do.
        lifecycle.record_end(engine, spec.run_id, RunStatus.stopped, details="stopped before start")
        return 0
    try:
        return asyncio.run(_run(runner_for(settings, folder, spec, engine)))
    except Exception as exc:
        kind, summary = classify(exc)
        lost = lost_engine(exc)
        if lost is not None:  # a new host, and this run again from its last checkpoint
            kind, summary = "engine", resume_on_a_new_host(engine, folder, spec.run_id, lost)
        try:
            lifecycle.record_end(
                engine, spec.run_id, RunStatus.failed, failure_kind=kind, details=summary
            )
        finally:
            # Printed after the record: on a full disk, writing the log may fail as well.
            log.error("run failed: %s", summary)
            traceback.print_exc()
        return 1


def runner_for(
    settings: Settings, folder: RunFolder, spec: RunSpec, engine: Engine
) -> RunnerBase[Any, Any]:
    """The loop that trains this run: its framework's trainer (core.frameworks; another
    framework's environments run in processes of their own, docs/atropos.md, docs/verifiers.md)."""
    trainer: Callable[[Settings, RunFolder, RunSpec, Engine], RunnerBase[Any, Any]]
    trainer = load(FRAMEWORKS[spec.framework].trainer)
    return trainer(settings, folder, spec, engine)


async def _run(trainer: RunnerBase[Any, Any]) -> int:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, trainer.stop_event.set)
    watcher = asyncio.create_task(_watch_stop_request(trainer))
    try:
        status = await trainer.run()
    finally:
        watcher.cancel()
    details = (
        f"stopped at step {trainer.step}; resumable from its checkpoint"
        if status == RunStatus.stopped
        else None
    )
    lifecycle.record_end(trainer.engine, trainer.run_id, status, details=details)
    print(f"run {status.value} at step {trainer.step}", flush=True)
    return 0


async def _watch_stop_request(trainer: RunnerBase[Any, Any]) -> None:
    """A stop asked through the database works like SIGTERM, from a server that cannot signal
    this process (another machine, or one that adopted the run)."""
    while not trainer.stop_event.is_set():
        await asyncio.sleep(STOP_POLL_S)
        try:
            asked = await asyncio.to_thread(
                lifecycle.stop_requested, trainer.engine, trainer.run_id
            )
        except Exception:  # a database hiccup must not end the run; SIGTERM still works
            log.warning("could not read the stop request; trying again", exc_info=True)
            continue
        if asked:
            log.info("a stop was requested through the database")
            trainer.stop_event.set()


def classify(exc: Exception) -> tuple[str, str]:
    """A failure kind and a one-line reason a user can act on, from the exception's type."""
    # A full disk surfaces as whatever the writing library raises (its errno may only be in
    # the message or a chained cause), so it is recognised before the type.
    if full_errno(exc) is not None:
        return DiskFull.category, disk_full_reason(exc)
    if isinstance(exc, RunFailure):
        return exc.category, exc.reason()
    if isinstance(exc, ImportError):
        return "environment", f"the environment could not be imported: {exc}"
    return RunFailure.category, f"{type(exc).__name__}: {exc}"


def disk_full_reason(exc: BaseException) -> str:
    where = getattr(exc, "filename", None)
    what = f"while writing {where}" if where else f"({type(exc).__name__}: {exc})"
    return (
        f"the disk is full (or its quota used up): the run stopped {what}. Free space on that "
        "disk, or save checkpoints less often (save_every), then resume the run: it continues "
        "from its last complete checkpoint, which the failed write left intact."
    )
