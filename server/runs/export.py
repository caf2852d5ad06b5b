"""Export a run's checkpoint as a Hugging Face folder: choose the checkpoint and the destination
here (torch-free), then let `python -m runners.export` write it in its own process."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.checkpoint_check import SAMPLER_KIND, is_remote
from core.models import Run
from core.settings import PROJECT_ROOT, Settings
from server.errors import Conflict, DomainError, InvalidValue, Unavailable
from server.runs.metrics import MetricsService
from server.runs.rollouts import RolloutService
from server.runs.schemas import CheckpointOut, ExportOut
from server.runs.service import RunService

log = logging.getLogger(__name__)
# runners.export.job's exit codes: the checkpoint failed its check; the destination is taken.
_EXIT_UNUSABLE, _EXIT_EXISTS = 3, 4


@dataclass(frozen=True)
class ExportJob:
    run_id: str
    step: int
    source: str  # the sampler folder, or for Tinker the state checkpoint's tinker:// path
    tinker: bool
    merged: bool
    destination: Path
    overwrite: bool
    card: dict[str, Any]
    include_rollouts: bool = False


class ExportService:
    def __init__(
        self,
        settings: Settings,
        runs: RunService,
        metrics: MetricsService,
        rollouts: RolloutService,
    ) -> None:
        self._settings = settings
        self._runs = runs
        self._metrics = metrics
        self._rollouts = rollouts
        self._busy: set[Path] = set()
        self._lock = threading.Lock()

    def export(
        self,
        run_id: str,
        checkpoint_step: int | None,
        merged: bool,
        path: str | None,
        overwrite: bool,
        *,
        include_rollouts: bool = False,
    ) -> ExportOut:
        job = self.plan(run_id, checkpoint_step, merged, path, overwrite)
        job = dataclasses.replace(job, include_rollouts=include_rollouts)
        with self._lock:
            if job.destination in self._busy:
                raise Conflict(
                    f"path: an export into {job.destination} is under way; wait for it, or "
                    "choose another path."
                )
            self._busy.add(job.destination)
        try:
            answer = self._write(job)
        finally:
            with self._lock:
                self._busy.discard(job.destination)
        return ExportOut(
            run_id=job.run_id,
            step=job.step,
            path=str(job.destination),
            files=answer.get("files", []),
            merged=job.merged,
            format=answer.get("format"),
            base_model=answer.get("base_model"),
        )

    # Choosing -----------------------------------------------------------------------------

    def plan(
        self,
        run_id: str,
        checkpoint_step: int | None,
        merged: bool,
        path: str | None,
        overwrite: bool,
    ) -> ExportJob:
        """What to export and where, or the 404/409/422 that says why not (nothing written)."""
        run = self._runs.row(run_id)
        rows = self._runs.checkpoints(run_id)
        sampler = self._runs.checkpoint(run_id, SAMPLER_KIND, checkpoint_step, "export")
        step, source = sampler.step, sampler.path
        tinker = is_remote(source)
        if tinker:
            if merged:
                raise InvalidValue(
                    "merged: a Tinker run is exported as Tinker writes its weights (its external "
                    "Hugging Face format); leave merged out, and merge after downloading if needed."
                )
            source = self._tinker_state(run_id, rows, step)
        destination = self._destination(run, step, merged, path, overwrite)
        card = {
            "run_id": run.id,
            "step": step,
            "total_steps": run.total_steps,
            "environment": run.environment,
            "config_hash": run.config_hash,
            "reward_mean": self._metrics.latest_rewards([run.id]).get(run.id),
            "backend": "tinker" if tinker else "local",
        }
        return ExportJob(run.id, step, source, tinker, merged, destination, overwrite, card)

    @staticmethod
    def _tinker_state(run_id: str, rows: list[CheckpointOut], step: int) -> str:
        # Tinker writes external weights from a training client, which loads a state checkpoint.
        for row in rows:
            if row.kind == "state" and row.step == step and is_remote(row.path):
                return row.path
        raise Conflict(
            f"checkpoint_step: run {run_id} has a Tinker sampler checkpoint at step {step} but no "
            "state checkpoint there, and Tinker exports weights only from a state checkpoint; "
            "choose a step that has both (GET /runs/{id}/checkpoints)."
        )

    def _destination(
        self, run: Run, step: int, merged: bool, path: str | None, overwrite: bool
    ) -> Path:
        if path is None:
            destination = Path(run.run_dir) / "export" / f"step-{step}{'-merged' if merged else ''}"
        else:
            root = self._settings.export_root.resolve()
            try:
                destination = (root / path).resolve()
            except (ValueError, OSError, RuntimeError) as exc:
                raise InvalidValue(f"path: {path!r} is not a usable path ({exc}).") from None
            if root not in destination.parents:
                raise InvalidValue(
                    f"path: {path!r} is outside the export folder {root} (RLCS_EXPORT_DIR), the "
                    "only place an export may be written; give a name inside it (e.g. "
                    f"'my-model', which becomes {root / 'my-model'}), or leave path out to "
                    "export into the run's folder."
                )
        if destination.is_symlink() or (destination.exists() and not destination.is_dir()):
            raise Conflict(f"path: {destination} exists and is not a folder; choose another path.")
        if destination.is_dir() and any(destination.iterdir()) and not overwrite:
            raise Conflict(
                f"path: {destination} exists and is not empty; pass overwrite: true to replace "
                "it, or choose another path."
            )
        return destination

    # Writing ------------------------------------------------------------------------------

    def _write(self, job: ExportJob) -> dict[str, Any]:
        with self._rollouts_file(job) as rollouts:
            return self._run_exporter(job, rollouts)

    @contextmanager
    def _rollouts_file(self, job: ExportJob) -> Iterator[Path | None]:
        """The run's recorded episodes as JSON lines, beside the destination (the exporter
        moves them into the folder it renames into place); None when not asked for."""
        if not job.include_rollouts:
            yield None
            return
        job.destination.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=job.destination.parent, prefix=".rollouts-", suffix=".jsonl", delete=False
        ) as out:
            out.writelines(self._rollouts.export_lines(job.run_id))
        path = Path(out.name)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)

    def _run_exporter(self, job: ExportJob, rollouts: Path | None) -> dict[str, Any]:
        argv = _exporter_argv(self._settings.python_executable, job, rollouts)
        timeout = self._settings.export_timeout_s
        proc = subprocess.Popen(
            argv,
            cwd=PROJECT_ROOT,
            env=self._settings.child_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own group: a timeout ends the export and its helpers
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise Unavailable(
                f"The export of run {job.run_id} step {job.step} took longer than {timeout:g} s "
                "(RLCS_EXPORT_TIMEOUT_S) and was stopped; nothing was written to "
                f"{job.destination}. Raise the limit or try again."
            ) from None
        answer = _last_json(out)
        if proc.returncode == 0 and answer.get("ok"):
            return answer
        why = answer.get("error") or f"the exporter exited with code {proc.returncode}"
        log.warning("export of %s step %s failed: %s\n%s", job.run_id, job.step, why, err[-4000:])
        raise _failure(job, proc.returncode, why)


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def _exporter_argv(python: str, job: ExportJob, rollouts: Path | None) -> list[str]:
    """The command line of `python -m runners.export` for `job`."""
    argv = [
        python,
        "-m",
        "runners.export",
        "--tinker-state" if job.tinker else "--sampler",
        job.source,
        "--out",
        str(job.destination),
        "--name",
        f"{job.run_id}-step-{job.step}",
        "--card",
        json.dumps(job.card),
    ]
    argv += ["--merged"] * job.merged + ["--overwrite"] * job.overwrite
    argv += ["--rollouts", str(rollouts)] if rollouts is not None else []
    return argv


def _failure(job: ExportJob, returncode: int, why: str) -> DomainError:
    """The error a failed export answers with: a checkpoint that cannot be exported and a
    destination that exists are the caller's to change (409); anything else is ours (503)."""
    if returncode == _EXIT_UNUSABLE:
        return Conflict(
            f"checkpoint_step: the checkpoint at step {job.step} of run {job.run_id} cannot "
            f"be exported ({why}); choose another step."
        )
    if returncode == _EXIT_EXISTS:
        return Conflict(f"path: {why}; pass overwrite: true to replace it, or choose another path.")
    return Unavailable(
        f"The export of run {job.run_id} step {job.step} failed: {why}. Nothing was written "
        f"to {job.destination}; the server log has the details."
    )
