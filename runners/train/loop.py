"""The training runner: `python -m runners.train --run-dir DIR` is what a run is.

It reads DIR/config.json (the RunSpec frozen by the server), records its progress in the
database, and runs the RL loop, one step at a time: sample with the current weights ->
advantages -> forward_backward + optim_step -> record; checkpoints and evaluations between
steps. SIGTERM ends it cleanly with a checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from core import lifecycle
from core.db import make_engine
from core.failures import RunFailure
from core.models import RunStatus
from core.procs import process_start_time
from core.run_folder import RunFolder
from core.settings import Settings
from core.spec import RunSpec
from environments.base import EnvConfig
from runners.engine.disk_full import DiskFull, full_errno
from runners.episodes.policy import SamplerPolicy
from runners.episodes.rollouts import Collected, Episode
from runners.episodes.sources import env_context, load_sources
from runners.train.advantages import Weighted, grpo_advantages, rebn_advantages
from runners.train.datums import kl_metrics, make_datums
from runners.train.rollout_records import episode_records
from runners.train.run_base import RunnerBase

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from runners.backends.surface import SamplingClient, TrainingClient
    from runners.episodes.collection import Collector

log = logging.getLogger("runner")
STOP_POLL_S = 1.0  # how often the runner reads whether a stop was requested


class Trainer(RunnerBase):
    """A run on our environments (environments.base)."""

    def __init__(self, settings: Settings, folder: RunFolder, spec: RunSpec, engine: Engine):
        sources = load_sources(spec, env_context(settings))
        config: EnvConfig = sources[0].config  # training settings come from it
        super().__init__(settings, folder, spec.run_id, engine, config, config.total_steps)
        self.sources = sources
        self.config = config

    # Set-up --------------------------------------------------------------------------------

    async def set_up(self) -> TrainingClient:
        """Backend, tokenizer, collector and reporter; a training client, fresh or resumed."""
        # Heavy imports live here so `--help` and the server's imports stay light.
        from runners.episodes.collection import Collector, concurrency_for
        from runners.episodes.render import Renderer
        from runners.models.loading import load_tokenizer

        cfg = self.config
        service = self.open_service()
        log.info(
            "run %s: %s on %s backend, model %s",
            self.run_id,
            " + ".join(f"{s.name} (weight {s.weight:g})" for s in self.sources),
            self.backend,
            cfg.model_name,
        )
        tokenizer = load_tokenizer(cfg.model_name, self.settings.models_dir)
        self.renderer = Renderer(tokenizer, cfg.prompt_template, cfg.system_prompt)
        self.collector: Collector = Collector(
            self.sources, self.renderer, concurrency_for(cfg, self.backend)
        )
        return await self.open_training(service)

    # One step ------------------------------------------------------------------------------

    async def train_step(self, training: TrainingClient, step: int) -> None:
        started = time.monotonic()
        collected = await self.sample(training, step)
        sampled = time.monotonic()
        weighted, dropped = self.advantages(self.collector.usable(collected), step)
        train_metrics = await self.train(training, weighted)
        trained = time.monotonic()
        self.step = step
        r = self.renderer
        self.reporter.rollouts(
            step,
            lambda: episode_records(collected.episodes, weighted, r.decode, r.stop_token_ids()),
        )
        self.record(
            step,
            collected,
            {
                **train_metrics,
                "sampler/dropped_groups": dropped,
                "time/sample": sampled - started,
                "time/train": trained - sampled,
                "time/step": trained - started,
            },
        )
        cfg = self.config
        if self.checkpoint_due(step):
            await self.checkpoint(training)
        if cfg.steps_per_eval and step % cfg.steps_per_eval == 0:
            await self.evaluate(training)

    async def sample(self, training: TrainingClient, step: int) -> Collected:
        """The step's episodes, sampled from a snapshot of the current weights."""
        sampler = await self._call(
            training.save_weights_and_get_sampling_client(), "sampler snapshot"
        )
        collected = await self._until_stopped(
            self.collector.train_batch(self._policy(sampler, step), step)
        )
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

    def advantages(self, episodes: list[Episode], step: int) -> tuple[list[Weighted], int]:
        """Weighted transitions and the number of groups dropped (no signal in them)."""
        cfg = self.config
        if cfg.advantage == "rebn":
            return rebn_advantages(episodes, cfg.gamma, cfg.batch_size, seed=cfg.seed + step), 0
        return grpo_advantages(episodes, cfg.scale_advantage_by_std)

    async def train(self, training: TrainingClient, weighted: list[Weighted]) -> dict[str, float]:
        """forward_backward and optim_step, submitted back to back, then awaited."""
        datums, kept = make_datums(weighted)
        if not datums:
            return {}
        cfg = self.config
        fwd_bwd = training.forward_backward(datums, cfg.loss_fn, dict(cfg.loss_fn_config))
        optim = training.optim_step(self.adam)
        result = await self._call(fwd_bwd, "forward_backward")
        await self._call(optim, "optim_step")
        action_tokens = sum(len(w.transition.action_tokens) for w in kept)
        loss_sum = float(result.metrics.get("loss:sum", 0.0))
        return {
            "train/loss": loss_sum / max(1, action_tokens),
            "train/loss_sum": loss_sum,
            "train/num_datums": len(datums),
            "train/num_action_tokens": action_tokens,
            **kl_metrics(kept, result.loss_fn_outputs),
        }

    def record(self, step: int, collected: Collected, metrics: dict[str, float]) -> None:
        episode_metrics = self.collector.metrics(collected.episodes, "env")
        all_metrics = {
            **episode_metrics,
            "sampler/failed_episodes": collected.failed,
            **metrics,
        }
        self.reporter.step(step, self.config.total_steps, all_metrics)
        example = self.collector.example(collected.episodes)
        if example:
            print(example, flush=True)

    # Between steps -------------------------------------------------------------------------

    async def evaluate(self, training: TrainingClient) -> None:
        """Held-out tasks (`eval` split) of every environment of the run, one episode each."""
        sampler = await self._call(
            training.save_weights_and_get_sampling_client(), "sampler snapshot"
        )
        policy = self._policy(sampler, 10_000_000 + self.step)
        collected = await self._until_stopped(self.collector.eval_batch(policy))
        metrics = self.collector.metrics(collected.episodes, "eval")
        metrics["eval/failed_episodes"] = collected.failed
        self.reporter.eval(self.step, metrics)

    # Teardown ------------------------------------------------------------------------------

    async def tear_down(self, training: TrainingClient, status: RunStatus) -> None:
        """A last checkpoint (also on a stop), a last evaluation when one is due, W&B closed."""
        cfg = self.config
        await self.checkpoint(training, final=status == RunStatus.succeeded)
        due = cfg.steps_per_eval and cfg.total_steps % cfg.steps_per_eval != 0
        if status == RunStatus.succeeded and due:
            await self.evaluate(training)
        self.reporter.finish_wandb()

    # Helpers -------------------------------------------------------------------------------

    def _policy(self, sampler: SamplingClient, step: int) -> SamplerPolicy:
        cfg = self.config
        return SamplerPolicy(
            sampler,
            max_tokens=cfg.max_token_length,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop=self.renderer.stop_token_ids(),
            seed=(cfg.seed * 7_919 + step) * 100_003,
            timeout_s=self.settings.backend_call_timeout_s,
        )


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
        try:
            lifecycle.record_end(
                engine, spec.run_id, RunStatus.failed, failure_kind=kind, details=summary
            )
        finally:
            # Printed after the record: on a full disk, writing the log may fail as well.
            log.error("run failed: %s", summary)
            traceback.print_exc()
        return 1


def runner_for(settings: Settings, folder: RunFolder, spec: RunSpec, engine: Engine) -> RunnerBase:
    """The loop that trains this run: ours, or the Atropos trainer (its environment runs in
    processes of its own, docs/atropos.md)."""
    if spec.framework == "atropos":
        from runners.atropos.trainer import AtroposTrainer

        return AtroposTrainer(settings, folder, spec, engine)
    return Trainer(settings, folder, spec, engine)


async def _run(trainer: RunnerBase) -> int:
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


async def _watch_stop_request(trainer: RunnerBase) -> None:
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
