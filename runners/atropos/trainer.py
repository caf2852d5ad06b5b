"""An Atropos run: the runner takes the tinker-atropos trainer's role (docs/atropos.md).

It serves the run's current policy on a loopback inference face, starts atroposlib's own
trajectory API and the environment (`<atropos python> FILE serve --config YAML`, in the file's
folder) beside itself, registers, and then for each step: takes a batch of scored groups from
the API, turns them into datums, trains, and swaps the policy the face serves. The run ends
when total_steps are trained (the environment exits earlier, once enough is queued); an API
or environment that dies while data is still needed fails the run with its log's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from core import lifecycle
from core.atropos import METRICS_FILE_VARIABLE, OFFPOLICY_BATCHES, AtroposRunConfig
from core.failures import RunFailure
from core.models import RunStatus
from core.run_folder import RunFolder
from core.settings import Settings
from core.spec import RunSpec
from runners.atropos.children import REDACTED, Child, atropos_environment, start_child
from runners.atropos.env_yaml import write_env_yaml
from runners.atropos.face import InferenceFace, serving
from runners.atropos.groups import Batch, Sequence, datum, kl_metrics, read_batch
from runners.atropos.requests import SamplingDefaults
from runners.atropos.rollout_records import sequence_records
from runners.atropos.watch import EvalWatch, LogWatch, MetricsTap
from runners.train.run_base import RunnerBase

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from runners.backends.surface import TrainingClient

log = logging.getLogger("runner")
BATCH_POLL_S = 0.2  # how often an empty trajectory API is asked again
HOSTED_CONTEXT = 32_768  # max_token_len registered when the model's context is not known here
DRAIN_S = 60.0  # at the end, how long samples already running may take to finish
ENV_DONE_GRACE_S = 2.0  # after the environment's exit 0, how long its queue may give nothing


class EnvironmentFailed(RunFailure):
    """The environment (or the trajectory API) ended or hung while the run needed it."""

    category = "environment"


class Stalled(RunFailure):
    """No usable batch came for RLCS_ATROPOS_STALL_S; the message says why, from its log."""

    category = "stalled"


class AtroposTrainer(RunnerBase):
    def __init__(self, settings: Settings, folder: RunFolder, spec: RunSpec, engine: Engine):
        config = AtroposRunConfig.model_validate(spec.config)
        super().__init__(settings, folder, spec.run_id, engine, config, config.total_steps)
        self.config = config
        self.spec = spec
        self.work = folder.path / "atropos"
        self.children: list[Child] = []
        self._exits = contextlib.AsyncExitStack()
        self._http = httpx.AsyncClient(timeout=30)
        self._stall_noted = False
        self._env_done_at: float | None = None  # when its exit (0) was first seen

    async def run(self) -> RunStatus:
        try:
            return await super().run()
        finally:
            await self.close()

    # Set-up --------------------------------------------------------------------------------

    async def set_up(self) -> TrainingClient:
        from core.model_names import context_length
        from runners.models.loading import load_tokenizer, tokenizer_folder

        cfg = self.config
        service = self.open_service()
        models = self.settings.models_dir
        log.info(
            "run %s: Atropos environment %s (%s) on %s backend, model %s",
            self.run_id,
            self.spec.environment,
            self.spec.env_file,
            self.backend,
            cfg.model_name,
        )
        tokenizer = load_tokenizer(cfg.model_name, models)
        tokenizer_dir = tokenizer_folder(cfg.model_name, models)
        self.context = context_length(cfg.model_name, models) if self.backend == "local" else None
        training = await self.open_training(service)
        self.face = InferenceFace(
            tokenizer,
            SamplingDefaults(
                max_tokens=int(cfg.env_values().get("max_token_length") or 256),
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
            ),
            self.context,
            _end_ids(tokenizer),
            cfg.model_name,
        )
        self.face.set_sampler(await self._snapshot(training))
        face_url = await self._exits.enter_async_context(serving(self.face))
        self.api_url = await self._start_api()
        await self._register()
        self.work.mkdir(parents=True, exist_ok=True)
        wandb_name = cfg.wandb_name or self.spec.environment
        yaml_path = write_env_yaml(
            self.work / "env.yaml",
            cfg,
            tokenizer_dir=tokenizer_dir,
            api_url=self.api_url,
            face_url=face_url,
            key=self.face.key,
            wandb_name=wandb_name,
            evals_dir=self.work / "evals",
        )
        metrics_file = self.work / "env-metrics.jsonl"
        env_log = self.work / "env.log"
        log_start, metrics_start = _size(env_log), _size(metrics_file)
        env_file = Path(self.spec.env_file)
        self.env = self._start(
            "environment",
            [self.settings.atropos_python, str(env_file), "serve", "--config", str(yaml_path)],
            env_file.parent,
            env_log,
            **{
                METRICS_FILE_VARIABLE: str(metrics_file),
                "WANDB_MODE": "offline" if cfg.use_wandb else "disabled",
                "WANDB_DIR": str(self.work),
                "WANDB_SILENT": "true",
            },
        )
        # From where this attempt starts: a resumed run's folder holds the last one's too.
        self.log_watch = LogWatch(env_log, offset=log_start)
        self.tap = MetricsTap(metrics_file, wandb_name, offset=metrics_start)
        evals = self.work / "evals" / "metrics.json"
        self.evals = EvalWatch(evals, seen=evals.stat().st_mtime if evals.exists() else 0.0)
        self.env_started_at = time.monotonic()
        return training

    def _start(self, name: str, argv: list[str], cwd: Path, log_path: Path, **env: str) -> Child:
        child = start_child(
            name,
            argv,
            cwd,
            atropos_environment(self.settings.inspector_environment(), **env),
            log_path,
            secret=self.face.key,
        )
        self.children.append(child)
        return child

    async def _start_api(self) -> str:
        """atroposlib's trajectory API, unmodified, on a loopback port; its URL once it answers."""
        deadline = time.monotonic() + self.settings.atropos_start_timeout_s
        for _attempt in range(3):  # a port taken between choosing and binding: another one
            port = _free_port()
            self.api = self._start(
                "trajectory API",
                [
                    self.settings.atropos_python,
                    "-m",
                    "uvicorn",
                    "atroposlib.api:app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--no-access-log",
                ],
                self.folder.path,
                self.work / "api.log",
            )
            url = f"http://127.0.0.1:{port}"
            while self.api.exit_code() is None:
                if time.monotonic() > deadline:
                    raise EnvironmentFailed(
                        f"the trajectory API did not answer within "
                        f"{self.settings.atropos_start_timeout_s:g} s "
                        f"(RLCS_ATROPOS_START_TIMEOUT_S); {self.api.describe_exit()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    answer = await self._http.get(f"{url}/", timeout=2)
                    if answer.status_code == 200:
                        return url
                await asyncio.sleep(0.1)
            if "address already in use" not in self.api.tail().lower():
                break
        raise EnvironmentFailed(f"the trajectory API did not start: {self.api.describe_exit()}")

    async def _register(self) -> None:
        """The trainer's registration, then a first /batch: the API counts the trainer as
        started then, and only then lets the environment register."""
        cfg = self.config
        longest = cfg.max_token_trainer_length or self.context or HOSTED_CONTEXT
        body = {
            "wandb_group": self.run_id,
            "wandb_project": cfg.wandb_project,
            "batch_size": cfg.group_size * cfg.groups_per_step,
            "max_token_len": longest,
            "checkpoint_dir": str(self.work),
            "save_checkpoint_interval": cfg.save_every or -1,
            "starting_step": self.step,
            "num_steps": cfg.total_steps,
        }
        answer = await self._http.post(f"{self.api_url}/register", json=body)
        answer.raise_for_status()
        await self._http.get(f"{self.api_url}/batch")
        log.info(
            "registered with the trajectory API: %s sequences (%s groups of %s) per step, "
            "sequences up to %s tokens, at most %s batch ahead",
            body["batch_size"],
            cfg.groups_per_step,
            cfg.group_size,
            longest,
            OFFPOLICY_BATCHES,
        )

    # One step ------------------------------------------------------------------------------

    async def train_step(self, training: TrainingClient, step: int) -> None:
        started = time.monotonic()
        groups = await self._until_stopped(self.next_batch(step))
        received = time.monotonic()
        cfg = self.config
        batch = read_batch(groups, cfg.advantage, cfg.scale_advantage_by_std, self.context)
        recomputed = await self.fill_logprobs(batch.sequences)
        pause = self.face.paused() if self.backend == "local" else contextlib.nullcontext()
        with pause:  # the local backend trains on what also samples: one at a time
            train_metrics = await self.train(training, batch.sequences)
            self.face.set_sampler(await self._snapshot(training))
        trained = time.monotonic()
        self.step = step
        metrics = {
            **batch.metrics(),
            **train_metrics,
            **self.face.stats.take(),
            **self.log_watch.take(),
            **self.tap.take(),
            "atropos/recomputed_logprobs": float(recomputed),
            "atropos/queue_size": float(await self._queue_size()),
            "time/sample": received - started,
            "time/train": trained - received,
            "time/step": trained - started,
        }
        face = self.face
        self.reporter.rollouts(
            step,
            lambda: sequence_records(groups, batch.sequences, face.decode, face.end_ids),
            metrics,
        )
        self.reporter.step(step, self.total_steps, metrics)
        example = _example(batch, self.face.decode)
        if example:
            print(example, flush=True)
        evals = self.evals.take()
        if evals:
            self.reporter.eval(step, evals)
        if self.checkpoint_due(step):
            await self.checkpoint(training)

    async def next_batch(self, step: int) -> list[dict[str, Any]]:
        """The next batch of scored groups; the environment's and the API's health watched
        meanwhile, and a wait with no batch (once the environment works) reported as a
        stall, then failed."""
        waiting_since = time.monotonic()
        stall_s = self.settings.atropos_stall_s
        notice_s = min(60.0, stall_s / 3)
        while True:
            batch = await self._batch()
            if batch:
                if self._stall_noted:
                    lifecycle.record_fields(self.engine, self.run_id, details=None)
                    self._stall_noted = False
                return batch
            await self._check_children(step)
            working_since = self._working_since()
            if working_since is not None:
                waited = time.monotonic() - max(waiting_since, working_since)
                if waited > notice_s and not self._stall_noted:
                    details = "stalled: " + self._stall(step, waited)
                    lifecycle.record_fields(self.engine, self.run_id, details=details)
                    self._stall_noted = True
                if waited > stall_s:
                    raise Stalled(self._stall(step, waited) + " (RLCS_ATROPOS_STALL_S)")
            await asyncio.sleep(BATCH_POLL_S)

    def _stall(self, step: int, waited: float) -> str:
        return (
            f"no usable batch from the environment for {waited:.0f} s (step {step}): "
            f"{self._evidence(self.log_watch.why_nothing())}"
        )

    def _evidence(self, why: str) -> str:
        """`why`, and what the face refused the environment meanwhile (a prompt beyond the
        model's context, say)."""
        stats = self.face.stats
        if stats.refused:
            why += (
                f"; the inference face refused {stats.refused} request(s), the last "
                f"{stats.last_refusal}"
            )
        return why

    async def _batch(self) -> list[dict[str, Any]] | None:
        try:
            answer = await self._http.get(f"{self.api_url}/batch")
            answer.raise_for_status()
            return answer.json().get("batch") or None
        except (httpx.HTTPError, ValueError) as exc:
            if self.api.exit_code() is not None:
                raise EnvironmentFailed(
                    f"the trajectory API ended while the run needed data: "
                    f"{self.api.describe_exit()}"
                ) from None
            log.warning("the trajectory API did not answer /batch: %s", exc)
            return None

    async def _check_children(self, step: int) -> None:
        if self.api.exit_code() is not None:
            raise EnvironmentFailed(
                f"the trajectory API ended while the run needed data for step {step}: "
                f"{self.api.describe_exit()}"
            )
        code = self.env.exit_code()
        if code is None:
            return
        if code != 0:
            raise EnvironmentFailed(
                f"the environment ended while the run needed data for step {step}: "
                f"{self.env.describe_exit()}"
            )
        # Exit 0: it stops once it has queued enough for total_steps, and what it queued
        # comes out of the API. A queue that gives no batch a moment later holds too little.
        now = time.monotonic()
        if self._env_done_at is None:
            self._env_done_at = now
        elif now - self._env_done_at > ENV_DONE_GRACE_S:
            raise EnvironmentFailed(
                f"the environment exited (0) without queueing enough for step {step} of "
                f"{self.total_steps} ({await self._queue_size()} group(s) left in the queue): "
                f"{self.env.describe_exit()}"
            )

    def _working_since(self) -> float | None:
        """When the environment asked for its first completion (None: not yet, and it fails
        once it has not for RLCS_ATROPOS_START_TIMEOUT_S: it hangs in its setup)."""
        first = self.face.stats.first_request_at
        if first is not None:
            return first
        limit = self.settings.atropos_start_timeout_s
        if time.monotonic() - self.env_started_at > limit:
            self.log_watch.read()
            why = (
                self.log_watch.why_nothing()
                if self.log_watch.total
                else "it hangs in its setup or its first item"
            )
            raise EnvironmentFailed(
                f"the environment asked for no completion within {limit:g} s of its start "
                f"(RLCS_ATROPOS_START_TIMEOUT_S): {self._evidence(why)}; "
                f"{self.env.describe_exit()}"
            )
        return None

    async def _queue_size(self) -> int:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            answer = await self._http.get(f"{self.api_url}/status", timeout=5)
            return int(answer.json().get("queue_size", 0))
        return 0

    async def fill_logprobs(self, sequences: list[Sequence]) -> int:
        """The sampler's logprobs for sequences the environment sent without them (it sampled
        through the OpenAI face and tokenized the text itself): the current policy's, which
        is the one that sampled them up to one swap."""
        from tinker import types

        missing = [s for s in sequences if s.logprobs is None]
        if not missing:
            return 0
        sampler = self.face.sampler
        results = await asyncio.gather(
            *(
                self._call(
                    sampler.compute_logprobs(types.ModelInput.from_ints(s.tokens)),
                    "compute_logprobs",
                )
                for s in missing
            )
        )
        for sequence, values in zip(missing, results, strict=True):
            sequence.logprobs = [0.0 if v is None else float(v) for v in values]
        return len(missing)

    async def train(self, training: TrainingClient, sequences: list[Sequence]) -> dict[str, float]:
        if not sequences:
            return {}
        cfg = self.config
        datums = [datum(s) for s in sequences]
        fwd_bwd = training.forward_backward(datums, cfg.loss_fn, dict(cfg.loss_fn_config))
        optim = training.optim_step(self.adam)
        result = await self._call(fwd_bwd, "forward_backward")
        await self._call(optim, "optim_step")
        tokens = sum(sum(s.trained[1:]) for s in sequences)
        loss_sum = float(result.metrics.get("loss:sum", 0.0))
        return {
            "train/loss": loss_sum / max(1, tokens),
            "train/loss_sum": loss_sum,
            "train/num_datums": float(len(datums)),
            "train/num_action_tokens": float(tokens),
            **kl_metrics(sequences, result.loss_fn_outputs),
        }

    async def _snapshot(self, training: TrainingClient) -> Any:
        return await self._call(training.save_weights_and_get_sampling_client(), "sampler snapshot")

    # Teardown ------------------------------------------------------------------------------

    async def tear_down(self, training: TrainingClient, status: RunStatus) -> None:
        """The environment and the API stop first (nothing more is needed of them), then the
        last checkpoint and W&B as for any run."""
        await self.stop_children()
        evals = self.evals.take() if hasattr(self, "evals") else {}
        if evals:
            self.reporter.eval(self.step, evals)
        await super().tear_down(training, status)

    async def stop_children(self) -> None:
        for child in reversed(self.children):
            await asyncio.to_thread(child.stop)

    async def close(self) -> None:
        """Everything this run started, ended (also after a failure); the key goes with it."""
        await self.stop_children()
        if hasattr(self, "face"):
            await self.face.drain(DRAIN_S)
        env_yaml = self.work / "env.yaml"
        if env_yaml.exists() and hasattr(self, "face"):  # kept to read, without the key
            env_yaml.write_text(env_yaml.read_text().replace(self.face.key, REDACTED.decode()))
        await self._exits.aclose()
        await self._http.aclose()


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _end_ids(tokenizer: Any) -> list[int]:
    from runners.episodes.render import Renderer

    return Renderer(tokenizer, "plain").stop_token_ids()


def _example(batch: Batch, decode: Any) -> str | None:
    """The best sequence's trained part in one line, so the log shows what the model does."""
    if not batch.sequences:
        return None
    best = max(batch.sequences, key=lambda s: s.score)
    response = [t for t, on in zip(best.tokens, best.trained, strict=True) if on]
    text = decode(response)[:160].replace("\n", " | ")
    return f"  best sequence (score {best.score:.3f}): {text!r}"
