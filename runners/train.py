"""The training runner: `python -m runners.train --run-dir DIR` is what a run is.

It reads DIR/config.json (frozen by the server), records its progress in the database, and
runs the RL loop: sampling weights -> episodes -> advantages -> datums -> forward_backward +
optim_step -> metrics -> checkpoints -> eval. SIGTERM ends it cleanly with a checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from environments.base import EnvConfig
from runners.policy import SamplerPolicy, bounded
from runners.rollouts import (
    Episode,
    Weighted,
    collect,
    grpo_advantages,
    kl_metrics,
    make_datums,
    rebn_advantages,
)
from runners.sources import Mixer, load_sources
from server import lifecycle
from server.db import make_engine
from server.lifecycle import RESUME_FILE
from server.models import RunStatus
from server.services.procs import process_start_time
from server.settings import Settings

log = logging.getLogger("runner")


class Stopped(Exception):
    """SIGTERM arrived: wind down with a checkpoint."""


class Trainer:
    def __init__(self, settings: Settings, run_dir: Path, frozen: dict[str, Any]) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.run_id: str = frozen["run_id"]
        self.sources = load_sources(frozen)
        self.config: EnvConfig = self.sources[0].config  # training settings come from it
        self.mixer = Mixer(self.sources)
        self.engine = make_engine(settings.db_url)
        self.stop_event = asyncio.Event()
        self.step = 0
        # The step of the last checkpoint this attempt holds (or resumed from): a stop right
        # after a periodic save must not save the same name again (Tinker refuses that).
        self.saved_step: int | None = None

    async def run(self) -> RunStatus:
        # Heavy imports live here so `--help` and the server's imports stay light.
        from tinker import types

        from runners.backends.factory import create_service, resolve_backend
        from runners.models import load_tokenizer
        from runners.render import Renderer
        from runners.report import Reporter

        cfg = self.config
        backend = resolve_backend(cfg.backend, self.settings)
        log.info(
            "run %s: %s on %s backend, model %s",
            self.run_id,
            " + ".join(f"{s.name} (weight {s.weight:g})" for s in self.sources),
            backend,
            cfg.model_name,
        )
        service = create_service(backend, self.settings, self.run_dir / "checkpoints")
        tokenizer = load_tokenizer(cfg.model_name, self.settings.models_dir)
        self.renderer = Renderer(tokenizer, cfg.prompt_template, cfg.system_prompt)
        self.reporter = Reporter(self.engine, self.settings, self.run_id, self.run_dir, cfg)

        # Training client: fresh, or from the state a resume (or resume_from) points at.
        resume = self._resume_point()
        if resume is not None:
            state_path, self.step = resume
            self.saved_step = self.step
            log.info("resuming from %s at step %s", state_path, self.step)
            training = await self._call(
                service.create_training_client_from_state_with_optimizer(state_path), "resume"
            )
        else:
            training = await self._call(
                service.create_lora_training_client(
                    base_model=cfg.model_name, rank=cfg.lora_rank, seed=cfg.seed
                ),
                "create_lora_training_client",
            )
        # Our own earlier attempt logged under this run's W&B id: rewind it to the checkpoint.
        own_resume = resume is not None and (self.run_dir / RESUME_FILE).exists()
        self.reporter.start_wandb(resume_step=self.step if own_resume else None)
        adam = types.AdamParams(learning_rate=cfg.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8)
        concurrency = self._concurrency(backend)
        status = RunStatus.succeeded
        try:
            while self.step < cfg.total_steps:
                if self.stop_event.is_set():
                    raise Stopped
                step = self.step + 1
                started = time.monotonic()

                # 1. Sample with the current weights.
                sampler = await self._call(
                    training.save_weights_and_get_sampling_client(), "sampler snapshot"
                )
                policy = self._policy(sampler, step)
                collected = await self._until_stopped(
                    self._collect_train(policy, step, concurrency)
                )
                sample_s = time.monotonic() - started

                if not collected.episodes and collected.failed:
                    raise RuntimeError(
                        f"every episode of step {step} failed ({collected.failed}), e.g. "
                        f"{collected.errors[0]}"
                    )
                episodes = self._usable(collected)

                # 2. Advantages and datums; 3. one optimisation step, submitted back to back.
                weighted, dropped = self._advantages(episodes, step)
                datums, kept = make_datums(weighted)
                train_metrics: dict[str, float] = {}
                train_started = time.monotonic()
                if datums:
                    fwd_bwd = training.forward_backward(
                        datums, cfg.loss_fn, dict(cfg.loss_fn_config)
                    )
                    optim = training.optim_step(adam)
                    result = await self._call(fwd_bwd, "forward_backward")
                    await self._call(optim, "optim_step")
                    action_tokens = sum(len(w.transition.action_tokens) for w in kept)
                    loss_sum = float(result.metrics.get("loss:sum", 0.0))
                    train_metrics = {
                        "train/loss": loss_sum / max(1, action_tokens),
                        "train/loss_sum": loss_sum,
                        "train/num_datums": len(datums),
                        "train/num_action_tokens": action_tokens,
                        **kl_metrics(kept, result.loss_fn_outputs),
                    }

                # 4. Metrics, checkpoints and evaluation.
                self.step = step
                metrics = {
                    **self._metrics_by_source(collected.episodes, "env"),
                    **train_metrics,
                    "sampler/failed_episodes": collected.failed,
                    "sampler/dropped_groups": dropped,
                    "time/sample": sample_s,
                    "time/train": time.monotonic() - train_started,
                    "time/step": time.monotonic() - started,
                }
                if collected.errors:
                    log.warning(
                        "step %s: %s episode(s) failed, e.g. %s",
                        step,
                        collected.failed,
                        collected.errors[0],
                    )
                self.reporter.step(step, cfg.total_steps, metrics)
                self._log_example(collected.episodes)
                if cfg.save_every and step % cfg.save_every == 0 and step < cfg.total_steps:
                    await self._checkpoint(training)
                if cfg.steps_per_eval and step % cfg.steps_per_eval == 0:
                    await self._evaluate(training, concurrency)
        except Stopped:
            log.info("SIGTERM: stopping after step %s", self.step)
            status = RunStatus.stopped
        await self._checkpoint(training, final=status == RunStatus.succeeded)
        if (
            status == RunStatus.succeeded
            and cfg.steps_per_eval
            and cfg.total_steps % cfg.steps_per_eval != 0
        ):
            await self._evaluate(training, concurrency)
        self.reporter.finish_wandb()
        return status

    # Collection ----------------------------------------------------------------------------

    async def _collect_train(self, policy: Any, step: int, concurrency: int) -> Any:
        cfg = self.config
        rng = random.Random(cfg.seed * 1_000_003 + step)
        if cfg.advantage == "rebn":
            # ReBN counts transitions: episodes keep coming until the batch is full.
            endless = (self.mixer.next().spec(g, rng.randrange(2**31)) for g in itertools.count())
            return await self._collect(
                endless, policy, concurrency, enough=lambda got: got.transitions >= cfg.batch_size
            )
        specs = []
        for group in range(cfg.batch_size):
            source, seed = self.mixer.next(), rng.randrange(2**31)
            specs.extend(source.spec(group, seed) for _ in range(source.group_size))
        return await self._collect(iter(specs), policy, concurrency)

    async def _collect(self, specs: Any, policy: Any, concurrency: int, **options: Any) -> Any:
        return await collect(
            specs,
            policy,
            self.renderer.prompt_tokens,
            self.renderer.decode,
            concurrency=concurrency,
            **options,
        )

    def _usable(self, collected: Any) -> list[Episode]:
        """Drop groups that lost more episodes than their environment tolerates
        (`max_failing_rollouts`, as OpenReward's trainer does)."""
        limits = {s.name: s.max_failing for s in self.sources}
        return [
            e
            for e in collected.episodes
            if limits.get(e.source) is None
            or collected.failed_by_group.get(e.group, 0) <= limits[e.source]  # type: ignore[operator]
        ]

    def _advantages(self, episodes: list[Episode], step: int) -> tuple[list[Weighted], int]:
        cfg = self.config
        if cfg.advantage == "rebn":
            return rebn_advantages(episodes, cfg.gamma, cfg.batch_size, seed=cfg.seed + step), 0
        return grpo_advantages(episodes, cfg.scale_advantage_by_std)

    def _log_example(self, episodes: list[Episode]) -> None:
        """One transcript line per step, so the log shows what the model actually does."""
        if not episodes:
            return
        best = max(episodes, key=lambda e: e.total_reward)
        last = best.transitions[-1]
        prompt = self.renderer.decode(last.prompt_tokens)[-120:].replace("\n", " | ")
        response = self.renderer.decode(last.action_tokens)[:160].replace("\n", " | ")
        print(
            f"  best episode ({len(best.transitions)} turns, return {best.total_reward:.3f}): "
            f"...{prompt!r} -> {response!r}",
            flush=True,
        )

    async def _evaluate(self, training: Any, concurrency: int) -> None:
        """Held-out tasks (`eval` split) of every environment of the run, one episode each."""
        cfg = self.config
        sampler = await self._call(
            training.save_weights_and_get_sampling_client(), "sampler snapshot"
        )
        policy = self._policy(sampler, 10_000_000 + self.step)
        specs = iter(
            [source.spec(i, i) for source in self.sources for i in range(cfg.eval_num_tasks)]
        )
        collected = await self._until_stopped(
            self._collect(specs, policy, concurrency, split="eval")
        )
        metrics = self._metrics_by_source(collected.episodes, "eval")
        metrics["eval/failed_episodes"] = collected.failed
        self.reporter.eval(self.step, metrics)

    def _metrics_by_source(self, episodes: list[Episode], prefix: str) -> dict[str, float]:
        """Totals, plus `<prefix>/<env>/...` per environment in multi-environment runs."""
        metrics = episode_metrics(episodes, prefix)
        if len(self.sources) > 1:
            for source in self.sources:
                mine = [e for e in episodes if e.source == source.name]
                for key, value in episode_metrics(mine, prefix).items():
                    if key.startswith(f"{prefix}/"):
                        metrics[f"{prefix}/{source.name}/{key.split('/', 1)[1]}"] = value
        return metrics

    async def _call(self, call: Any, what: str) -> Any:
        return await bounded(call, self.settings.backend_call_timeout_s, what)

    async def _until_stopped(self, work: Any) -> Any:
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

    def _policy(self, sampler: Any, step: int) -> Any:
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

    def _concurrency(self, backend: str) -> int:
        cfg = self.config
        if cfg.max_num_workers > 0:
            return cfg.max_num_workers
        # Local sampling batches concurrent requests, so one in flight per episode is best.
        per_step = cfg.batch_size * (cfg.group_size if cfg.advantage == "grpo" else 1)
        return min(64, max(1, per_step)) if backend == "local" else 64

    # Checkpoints and resume ----------------------------------------------------------------

    async def _checkpoint(self, training: Any, final: bool = False) -> None:
        if self.saved_step == self.step:
            log.info("step %s is already checkpointed; nothing new to save", self.step)
            return
        name = f"step-{self.step:06d}"
        state = await self._call(training.save_state(name), "save_state")
        sampler = await self._call(training.save_weights_for_sampler(name), "save_weights")
        self.saved_step = self.step
        self.reporter.checkpoint(self.step, name, state.path, sampler.path, final=final)

    def _resume_point(self) -> tuple[str, int] | None:
        resume_file = self.run_dir / RESUME_FILE
        if resume_file.exists():
            record = json.loads(resume_file.read_text())
            return record["state_path"], int(record["step"])
        if self.config.resume_from:
            return self.config.resume_from, step_from_name(self.config.resume_from)
        return None


def step_from_name(path: str) -> int:
    """The step in a checkpoint name like .../step-000050 (0 when the name has none)."""
    tail = path.rstrip("/").split("/")
    for part in reversed(tail):
        if part.startswith("step-") and part[5:].isdigit():
            return int(part[5:])
    return 0


def episode_metrics(episodes: list[Episode], prefix: str) -> dict[str, float]:
    if not episodes:
        return {f"{prefix}/num_episodes": 0}
    n = len(episodes)
    returns = [e.total_reward for e in episodes]
    out = {
        f"{prefix}/percent_correct": sum(e.correct for e in episodes) / n,
        f"{prefix}/reward_mean": sum(returns) / n,
        f"{prefix}/num_episodes": n,
    }
    # What environments report per step (format errors, tool-call errors...): per episode.
    totals: dict[str, float] = {}
    for episode in episodes:
        for t in episode.transitions:
            for key, value in t.metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value)
    out.update({f"{prefix}/{key}": total / n for key, total in totals.items()})
    if prefix == "env":
        out["reward/mean"] = out["env/reward_mean"]
        out["sampler/episode_return"] = out["env/reward_mean"]
        out["sampler/num_episodes"] = n
        out["sampler/num_turns_per_episode"] = sum(len(e.transitions) for e in episodes) / n
        out["sampler/action_num_tokens"] = (
            sum(len(t.action_tokens) for e in episodes for t in e.transitions) / n
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
    run_dir = args.run_dir.resolve()
    frozen = json.loads((run_dir / "config.json").read_text())
    run_id = frozen["run_id"]
    settings = Settings()
    engine = make_engine(settings.db_url)
    if not lifecycle.record_running(engine, run_id, os.getpid(), process_start_time(os.getpid())):
        # Stopped (or settled) before this process got going: nothing to do.
        lifecycle.record_end(engine, run_id, RunStatus.stopped, details="stopped before start")
        return 0
    try:
        return asyncio.run(_run(settings, run_dir, frozen, engine, run_id))
    except Exception as exc:
        kind, summary = classify(exc)
        log.error("run failed: %s", summary)
        traceback.print_exc()
        lifecycle.record_end(engine, run_id, RunStatus.failed, failure_kind=kind, details=summary)
        return 1


async def _run(
    settings: Settings, run_dir: Path, frozen: dict[str, Any], engine: Any, run_id: str
) -> int:
    trainer = Trainer(settings, run_dir, frozen)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, trainer.stop_event.set)
    status = await trainer.run()
    details = (
        f"stopped at step {trainer.step}; resumable from its checkpoint"
        if status == RunStatus.stopped
        else None
    )
    lifecycle.record_end(engine, run_id, status, details=details)
    print(f"run {status.value} at step {trainer.step}", flush=True)
    return 0


def classify(exc: Exception) -> tuple[str, str]:
    """A failure kind and a one-line reason a user can act on."""
    name = type(exc).__name__
    if name in ("TinkerUnavailable", "TinkerUnreachable"):
        return "backend", str(exc)
    if name == "ModelNotAvailable":
        return "model", str(exc)
    if name in ("ImportError", "ModuleNotFoundError"):
        return "environment", f"the environment could not be imported: {exc}"
    return "error", f"{name}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
