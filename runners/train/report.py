"""What a run reports: progress, metrics, rollouts and checkpoints to the database, W&B and its
log."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Engine

from core import lifecycle, rollouts
from core.rollout_recorder import Kept, RolloutRecorder
from core.rollouts import RolloutRecord
from core.run_folder import RunFolder, clean_metrics
from core.settings import Settings
from core.training_config import TrainingConfig
from runners.train.cost_meter import CostMeter

log = logging.getLogger(__name__)
# How long a step's W&B row waits for the previous step's rollouts table (then goes without).
TABLE_WAIT_S = 10.0

# A step's mean reward: the one key every reader takes it from (the server's `reward_mean`).
REWARD_KEY = "reward/mean"


@contextmanager
def timed(metrics: dict[str, float], name: str) -> Iterator[None]:
    """The block's wall time into `metrics["time/<name>_s"]`, in seconds."""
    started = time.monotonic()
    try:
        yield
    finally:
        metrics[f"time/{name}_s"] = time.monotonic() - started


def wandb_id_for(run_id: str) -> str:
    """A stable W&B run id, so every attempt of a run (resume) logs to the same W&B run."""
    return "rlcs-" + run_id.removeprefix("r-")


class Reporter:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        run_id: str,
        folder: RunFolder,
        config: TrainingConfig,
    ) -> None:
        self._engine = engine
        self._settings = settings
        self.run_id = run_id
        self.folder = folder
        self._config = config
        # What the run spends through its backend, charged with each step (core/cost.py).
        self.meter = CostMeter()
        self._wandb: Any = None
        # The recorder's thread logs W&B tables: one logger at a time, and never to a step
        # W&B has passed (it would drop it).
        self._wandb_lock = threading.Lock()
        self._wandb_step = 0
        values = config.model_dump(include={"rollouts_per_step", "rollouts_max_mb"})
        self._rollouts = RolloutRecorder(
            engine,
            run_id,
            per_step=rollouts.per_step(values),
            max_bytes=int(rollouts.max_mb(values) * rollouts.MB),
            seed=config.seed,
            on_written=self._log_table,
        )

    # W&B ---------------------------------------------------------------------------------

    def start_wandb(self, resume_step: int | None = None) -> None:
        """Online with a key, offline otherwise; a W&B failure never stops training.

        `resume_step`: this attempt continues the run from that step's checkpoint. W&B only
        accepts increasing steps, so an online run is rewound there first (the steps done
        again replace the abandoned ones, as in the database)."""
        if not self._config.use_wandb:
            return
        online = self._settings.wandb_api_key is not None
        try:
            import wandb

            wandb_id = wandb_id_for(self.run_id)
            options = self._wandb_options(wandb_id, online)
            self._wandb = None
            if online and resume_step is not None:
                try:
                    self._wandb = wandb.init(
                        **options, resume_from=f"{wandb_id}?_step={resume_step}"
                    )
                except Exception as exc:  # e.g. the first attempt never reached W&B
                    log.warning(
                        "W&B rewind to step %s failed (%s); resuming as is", resume_step, exc
                    )
            if self._wandb is None:
                self._wandb = wandb.init(**options, resume="allow")
        except Exception as exc:  # W&B is a mirror of the database, never a dependency
            log.warning("W&B logging disabled: %s", exc)
            self._wandb = None
            return
        run = self._wandb
        if online:
            path = f"{run.entity}/{run.project}/{run.id}"
            lifecycle.record_fields(self._engine, self.run_id, wandb_path=path, wandb_url=run.url)
        log.info("W&B run %s (%s)", run.id, "online" if online else "offline, in the run folder")

    def _wandb_options(self, wandb_id: str, online: bool) -> dict[str, Any]:
        """wandb.init's keywords (of several types): the run's project, name, folder, config."""
        name = self._config.wandb_name or f"{self._config.model_name.split('/')[-1]}"
        return {
            "project": self._config.wandb_project,
            "entity": self._settings.wandb_entity,
            "name": f"{name}-{self.run_id}",
            "id": wandb_id,
            "dir": str(self.folder.path),
            "config": self._config.model_dump(mode="json"),
            "mode": "online" if online else "offline",
        }

    def finish_wandb(self, exit_code: int = 0) -> None:
        """The run's records end: its rollouts written (boundedly), its W&B run finished."""
        self._rollouts.close()
        with self._wandb_lock:  # a table still being logged (the recorder ran late) first
            if self._wandb is not None:
                try:
                    self._wandb.finish(exit_code=exit_code)
                except Exception as exc:
                    log.warning("W&B finish failed: %s", exc)
                self._wandb = None

    # Records -----------------------------------------------------------------------------

    def rollouts(
        self,
        step: int,
        build: Callable[[], list[RolloutRecord]],
        step_metrics: dict[str, float] | None = None,
    ) -> None:
        """The step's episodes (made by `build`), recorded off the training path (with a W&B
        table of those kept); `step_metrics`: the environment's own (env/, atropos/) are kept
        with them. A failure costs the record of the step, never the run."""
        if self._rollouts.per_step <= 0 or self._rollouts.stopped is not None:
            return
        try:
            env_metrics = {
                k: v
                for k, v in (step_metrics or {}).items()
                if k.startswith(("env/", "atropos/", "verifiers/"))
            }
            self._rollouts.record(step, build(), env_metrics)
        except Exception as exc:
            log.warning("rollouts of step %s not recorded: %s", step, exc, exc_info=True)

    def _log_table(self, step: int, kept: Kept) -> None:
        """On the recorder's thread, once the step is written: its kept episodes as a W&B
        table in the step's row (the step's metrics are logged right after `rollouts`)."""
        if self._wandb is None:
            return
        from runners.train.rollout_table import wandb_table

        table = wandb_table(kept)
        with self._wandb_lock:
            if self._wandb is None or step < self._wandb_step:
                log.warning("W&B rollouts table of step %s skipped: W&B is past it", step)
                return
            self._wandb.log({"rollouts": table}, step=step)

    def step(self, step: int, total: int, metrics: dict[str, float], reward: float | None) -> None:
        """A trained step's metrics, with its mean `reward` (None: no sample came back)."""
        if reward is not None:
            metrics = {REWARD_KEY: reward, **metrics}
        if self._rollouts.per_step > 0:
            metrics = {**metrics, **self._rollouts.metrics()}
        metrics = lifecycle.record_step(
            self._engine, self.run_id, step, metrics, spent=self.meter.take()
        )
        if self._wandb is not None:
            # The previous step's table goes in before this step's row (W&B drops a log to a
            # step it has passed); the recorder still overlaps a step of training.
            self._rollouts.wait_for(step - 1, TABLE_WAIT_S)
        self._log_wandb(step, metrics)
        print(
            f"step {step}/{total} reward={_fmt(reward)} "
            f"correct={_pct(metrics.get('env/percent_correct'))} "
            f"loss={_fmt(metrics.get('train/loss'))} time={metrics.get('time/step_s', 0):.1f}s",
            flush=True,
        )

    def settle_cost(self) -> None:
        """What the run spent since its last step (a last checkpoint and evaluation, closing),
        when it ends however it ends; a failure to record it costs only that."""
        spent = self.meter.take()
        if spent is None:
            return
        try:
            lifecycle.record_spent(self._engine, self.run_id, spent)
        except Exception as exc:
            log.warning("the cost since the last step was not recorded: %s", exc)

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        lifecycle.record_metrics(self._engine, self.run_id, step, metrics)
        self._log_wandb(step, metrics)
        print(
            f"eval at step {step}: reward={_fmt(metrics.get('eval/reward_mean'))} "
            f"correct={_pct(metrics.get('eval/percent_correct'))}",
            flush=True,
        )

    def checkpoint(
        self,
        step: int,
        name: str,
        state_path: str | None,
        sampler_path: str | None,
        final: bool = False,
    ) -> None:
        if state_path:
            lifecycle.record_checkpoint(self._engine, self.run_id, step, "state", name, state_path)
        if sampler_path:
            lifecycle.record_checkpoint(
                self._engine, self.run_id, step, "sampler", name, sampler_path
            )
        record = {
            "name": name,
            "step": step,
            "state_path": state_path,
            "sampler_path": sampler_path,
            "final": final,
        }
        self.folder.append_checkpoint(record)
        print(f"checkpoint {name}: state={state_path} sampler={sampler_path}", flush=True)

    def _log_wandb(self, step: int, metrics: dict[str, float]) -> None:
        if self._wandb is None:
            return
        try:
            with self._wandb_lock:
                self._wandb.log(clean_metrics(metrics), step=step)
                self._wandb_step = max(self._wandb_step, step)
        except Exception as exc:
            log.warning("W&B log failed at step %s: %s", step, exc)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
