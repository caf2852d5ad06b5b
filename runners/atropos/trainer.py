"""An Atropos run: the runner takes the tinker-atropos trainer's role (docs/atropos.md).

It serves the run's current policy on a loopback inference face, starts atroposlib's own
trajectory API and the environment (`<atropos python> FILE serve --config YAML`, in the file's
folder) beside itself (`open_data`), registers, and then for each step: takes a batch of scored
groups from the API (feed.py), reads them as the learner's sequences (groups.py), drops the
groups sampled by a policy more than max(1, max_steps_off_policy) steps old (the face knows which
policy served each completion), trains (runners/train/learner.py), and swaps the policy the face
serves. The run ends
when total_steps are trained (the environment exits earlier, once enough is queued); an API
or environment that dies while data is still needed fails the run with its log's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from core import lifecycle
from core.atropos import (
    METRICS_FILE_VARIABLE,
    AtroposRunConfig,
    atropos_environment,
    offpolicy_batches,
)
from core.models import RunStatus
from core.process import REDACTED, Process, start_logged
from core.run_folder import RunFolder
from core.settings import Settings
from core.spec import RunSpec
from runners.atropos.env_yaml import write_env_yaml
from runners.atropos.feed import Environment, EnvironmentFailed, Feed
from runners.atropos.groups import Batch as Scored
from runners.atropos.groups import read_batch
from runners.atropos.rollout_records import sequence_records
from runners.atropos.watch import EvalWatch, LogWatch, MetricsTap
from runners.doors.face import DRAIN_S, InferenceFace, serving
from runners.doors.face_runner import FaceRunner
from runners.doors.requests import SamplingDefaults
from runners.train import staleness
from runners.train.learner import Sequence
from runners.train.report import timed
from runners.train.run_base import Batch, Prepared, Report, RunContext, Stepped

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from runners.backends.surface import TrainingClient

log = logging.getLogger("runner")
HOSTED_CONTEXT = 32_768  # max_token_len registered when the model's context is not known here

Run = RunContext[Feed]


@dataclass
class Drawn:
    """A step's batch as the API gave it (`groups`) and as read (`batch`)."""

    groups: list[dict[str, Any]]
    batch: Scored
    recomputed: int = 0  # sequences whose logprobs were recomputed (sent without)


class AtroposTrainer(FaceRunner[Feed, Drawn]):
    def __init__(self, settings: Settings, folder: RunFolder, spec: RunSpec, engine: Engine):
        config = AtroposRunConfig.model_validate(spec.config)
        super().__init__(settings, folder, spec.run_id, engine, config, config.total_steps)
        self.config = config
        self.spec = spec
        self.work = folder.path / "atropos"

    # Set-up --------------------------------------------------------------------------------

    def describe(self) -> str:
        return f"Atropos environment {self.spec.environment} ({self.spec.env_file})"

    async def open_data(
        self, backend: str, training: TrainingClient, exits: contextlib.AsyncExitStack
    ) -> Feed:
        """The face serving the current policy, the trajectory API (registered with) and the
        environment; each ends with the run, the face last (after what still samples)."""
        from core.model_names import context_length
        from runners.models.loading import load_tokenizer

        cfg = self.config
        models = self.settings.models_dir
        tokenizer = load_tokenizer(cfg.model_name, models)
        context = context_length(cfg.model_name, models) if backend == "local" else None
        http = httpx.AsyncClient(timeout=30)
        exits.push_async_callback(http.aclose)
        face = self._face(tokenizer, context)
        face.set_sampler(await self.snapshot(training), self.step)
        face_url = await exits.enter_async_context(serving(face))
        exits.push_async_callback(self._retire, face)
        api, api_url = await self._start_api(exits, http, face.key)
        await self._register(http, api_url, context)
        yaml_path = self._write_env_yaml(face, face_url, api_url)
        env = self._start_environment(exits, face.key, yaml_path)
        return Feed(
            settings=self.settings,
            total_steps=self.total_steps,
            face=face,
            context=context,
            http=http,
            api=api,
            api_url=api_url,
            env=env,
            note_stall=self._note_stall,
        )

    def _face(self, tokenizer: Any, context: int | None) -> InferenceFace:
        """The loopback face the environment samples the run's policy through."""
        cfg = self.config
        return InferenceFace(
            tokenizer,
            SamplingDefaults(
                max_tokens=int(cfg.env_values().get("max_token_length") or 256),
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
            ),
            context,
            _end_ids(tokenizer),
            cfg.model_name,
        )

    @property
    def _wandb_name(self) -> str:
        """The name the environment logs to W&B under (the prefix of its metrics' keys)."""
        return self.config.wandb_name or self.spec.environment

    def _write_env_yaml(self, face: InferenceFace, face_url: str, api_url: str) -> Path:
        """The environment's `--config` YAML: where the API and the face are, and its key."""
        from runners.models.loading import tokenizer_folder

        cfg = self.config
        self.work.mkdir(parents=True, exist_ok=True)
        return write_env_yaml(
            self.work / "env.yaml",
            cfg,
            tokenizer_dir=tokenizer_folder(cfg.model_name, self.settings.models_dir),
            api_url=api_url,
            face_url=face_url,
            key=face.key,
            wandb_name=self._wandb_name,
            evals_dir=self.work / "evals",
        )

    def _start_environment(
        self, exits: contextlib.AsyncExitStack, key: str, yaml_path: Path
    ) -> Environment:
        """`<atropos python> FILE serve --config YAML` in the file's folder, and the watches on
        what it writes."""
        metrics_file = self.work / "env-metrics.jsonl"
        env_log = self.work / "env.log"
        log_start, metrics_start = _size(env_log), _size(metrics_file)
        env_file = Path(self.spec.env_file)
        process = self._start(
            exits,
            key,
            "the environment",
            [self.settings.atropos_python, str(env_file), "serve", "--config", str(yaml_path)],
            env_file.parent,
            env_log,
            **{
                METRICS_FILE_VARIABLE: str(metrics_file),
                "WANDB_MODE": "offline" if self.config.use_wandb else "disabled",
                "WANDB_DIR": str(self.work),
                "WANDB_SILENT": "true",
            },
        )
        started_at = time.monotonic()
        evals = self.work / "evals" / "metrics.json"
        return Environment(
            process,
            started_at,
            # From where this attempt starts: a resumed run's folder holds the last one's too.
            log_watch=LogWatch(env_log, offset=log_start),
            tap=MetricsTap(metrics_file, self._wandb_name, offset=metrics_start),
            evals=EvalWatch(evals, seen=evals.stat().st_mtime if evals.exists() else 0.0),
        )

    def _start(
        self,
        exits: contextlib.AsyncExitStack,
        key: str,
        name: str,
        argv: list[str],
        cwd: Path,
        log_path: Path,
        **env: str,
    ) -> Process:
        """A child process, stopped when the run ends (in the reverse order of starting)."""
        child = start_logged(
            name,
            argv,
            cwd,
            atropos_environment(self.settings.inspector_environment(), **env),
            log_path,
            secret=key,
        )
        exits.push_async_callback(asyncio.to_thread, child.stop)
        return child

    async def _start_api(
        self, exits: contextlib.AsyncExitStack, http: httpx.AsyncClient, key: str
    ) -> tuple[Process, str]:
        """atroposlib's trajectory API, unmodified, on a loopback port; its URL once it answers."""
        deadline = time.monotonic() + self.settings.atropos_start_timeout_s
        for _attempt in range(3):  # a port taken between choosing and binding: another one
            port = _free_port()
            api = self._start(
                exits,
                key,
                "the trajectory API",
                self._api_command(port),
                self.folder.path,
                self.work / "api.log",
            )
            url = f"http://127.0.0.1:{port}"
            while api.exit_code() is None:
                if time.monotonic() > deadline:
                    raise EnvironmentFailed(
                        f"the trajectory API did not answer within "
                        f"{self.settings.atropos_start_timeout_s:g} s "
                        f"(RLCS_ATROPOS_START_TIMEOUT_S); {api.describe()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    answer = await http.get(f"{url}/", timeout=2)
                    if answer.status_code == 200:
                        return api, url
                await asyncio.sleep(0.1)
            if "address already in use" not in api.tail().lower():
                break
        raise EnvironmentFailed(f"the trajectory API did not start: {api.describe()}")

    def _api_command(self, port: int) -> list[str]:
        """atroposlib's API app under uvicorn, on loopback `port`."""
        return [
            self.settings.atropos_python,
            "-m",
            "uvicorn",
            "atroposlib.api:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
        ]

    async def _register(self, http: httpx.AsyncClient, api_url: str, context: int | None) -> None:
        """The trainer's registration, then a first /batch: the API counts the trainer as
        started then, and only then lets the environment register."""
        cfg = self.config
        longest = cfg.max_token_trainer_length or context or HOSTED_CONTEXT
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
        answer = await http.post(f"{api_url}/register", json=body)
        answer.raise_for_status()
        await http.get(f"{api_url}/batch")
        log.info(
            "registered with the trajectory API: %s sequences (%s groups of %s) per step, "
            "sequences up to %s tokens, at most %s batch ahead",
            body["batch_size"],
            cfg.groups_per_step,
            cfg.group_size,
            longest,
            offpolicy_batches(cfg.max_steps_off_policy),
        )

    def _note_stall(self, details: str | None) -> None:
        lifecycle.record_fields(self.engine, self.run_id, details=details)

    # One step ------------------------------------------------------------------------------

    async def next_batch(
        self, run: Run, step: int, times: dict[str, float]
    ) -> list[dict[str, Any]]:
        with timed(times, "sample"):
            return await self._until_stopped(run.data.next_batch(step))

    def read(self, run: Run, step: int, drawn: list[dict[str, Any]]) -> Batch[Drawn]:
        feed = run.data
        batch = read_batch(drawn, self.config.advantage, feed.context)
        self.tag_policies(feed.face, batch.sequences)
        # The environment samples the next batch while a step trains: the bound is at least 1.
        bound = max(1, self.config.max_steps_off_policy or 0)
        return Batch(Drawn(drawn, batch), batch.sequences, bound)

    async def settle(self, run: Run, batch: Batch[Drawn], prepared: Prepared) -> list[Sequence]:
        drawn = batch.own
        trained = drawn.batch.settle(prepared.sequences, prepared.dropped_groups)
        drawn.recomputed = await self.fill_logprobs(run.data.face, trained)
        return trained

    async def report(self, run: Run, done: Stepped[Drawn]) -> Report:
        feed, face, drawn = run.data, run.data.face, done.batch.own
        metrics = {
            **drawn.batch.metrics(),
            **done.prepared.off_policy,
            **done.train_metrics,
            **face.stats.take(),
            **feed.env.log_watch.take(),
            **feed.env.tap.take(),
            "atropos/recomputed_logprobs": float(drawn.recomputed),
            "atropos/queue_size": float(await feed.queue_size()),
            **done.times,
        }
        trained = done.trained
        return Report(
            metrics,
            drawn.batch.reward_mean(),
            lambda: sequence_records(drawn.groups, trained, face.decode, face.end_ids),
            example=_example(drawn.batch, face.decode),
            evals=feed.env.evals.take(),
        )

    def tag_policies(self, face: InferenceFace, sequences: list[Sequence]) -> None:
        """Each sequence tagged with the policy that served its trained tokens (the oldest,
        over its turns), where the face served them as they are (an environment that
        tokenized text itself may not match: untagged, kept by the staleness bound)."""
        for sequence in sequences:
            served = [face.policy_of(run) for run in _trained_runs(sequence)]
            known = [s for s in served if s is not None]
            sequence.meta[staleness.POLICY_STEP] = min(known) if known else None

    async def fill_logprobs(self, face: InferenceFace, sequences: list[Sequence]) -> int:
        """The sampler's logprobs for sequences the environment sent without them (it sampled
        through the OpenAI face and tokenized the text itself): the current policy's, which
        is the one that sampled them up to one swap."""
        from tinker import types

        missing = [s for s in sequences if s.logprobs is None]
        if not missing:
            return 0
        sampler = face.sampler
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

    # Teardown ------------------------------------------------------------------------------

    async def tear_down(self, run: Run, status: RunStatus) -> None:
        """The environment and the API stop first (nothing more is needed of them), then the
        last checkpoint and W&B as for any run."""
        await run.data.stop_children()
        evals = run.data.env.evals.take()
        if evals:
            run.reporter.eval(self.step, evals)
        await super().tear_down(run, status)

    async def _retire(self, face: InferenceFace) -> None:
        """At the run's end (also after a failure): samples still running finish, and the
        environment's YAML, kept to read, loses the run's key."""
        await face.drain(DRAIN_S)
        env_yaml = self.work / "env.yaml"
        if env_yaml.exists():
            env_yaml.write_text(env_yaml.read_text().replace(face.key, REDACTED.decode()))


def _trained_runs(sequence: Sequence) -> list[list[int]]:
    """The sequence's runs of trained tokens (each one completion the face served)."""
    runs: list[list[int]] = []
    previous = False
    for token, trained in zip(sequence.tokens, sequence.trained, strict=True):
        if trained and not previous:
            runs.append([])
        if trained:
            runs[-1].append(token)
        previous = trained
    return runs


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _end_ids(tokenizer: Any) -> list[int]:
    from runners.episodes.render import Renderer

    return Renderer(tokenizer, "plain").stop_token_ids()


def _example(batch: Scored, decode: Any) -> str | None:
    """The best sequence's trained part in one line, so the log shows what the model does."""
    if not batch.sequences:
        return None
    best = max(batch.sequences, key=lambda s: s.reward)
    response = [t for t, on in zip(best.tokens, best.trained, strict=True) if on]
    text = decode(response)[:160].replace("\n", " | ")
    return f"  best sequence (score {best.reward:.3f}): {text!r}"
