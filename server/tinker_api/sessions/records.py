"""A Tinker session as a run in the database: created running (its source and launcher say
"tinker-api", its pid is the server holding it), its models in its config, its optimizer
steps with their metrics, its checkpoints, its log lines and its end.

SessionRecords does the blocking work; the event loop hands it to a Recorder, whose one
writer thread writes in order (a step is recorded before the next).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import col, delete, select

from core import durable, lifecycle, procs, rollout_store, rollouts
from core.db import read_session, write_session
from core.models import FINISHED, TINKER_API, Checkpoint, Metric, Run, RunStatus, iso, utcnow
from core.rollouts import RolloutRecord
from core.run_folder import RunFolder, hash_config
from core.spec import RunSpec
from server.tinker_api.sessions.trace import TRACE_FILE

T = TypeVar("T")


class SessionRecords:
    def __init__(self, engine: Engine, runs_dir: Path) -> None:
        self._engine = engine
        self._runs_dir = runs_dir
        self._pid = os.getpid()
        self._start = procs.process_start_time(self._pid)

    def create(self, session: dict[str, Any]) -> tuple[str, Path]:
        """A new run for a new session (`session`: what create_session sent); its id (which
        is the session's id too) and folder."""
        while True:
            run_id = f"r-{secrets.token_hex(4)}"
            run_dir = self._runs_dir / run_id
            if not run_dir.exists():
                break
        config = {"source": TINKER_API, "backend": "local", "session": session, "models": {}}
        config_hash = hash_config(config)
        spec = RunSpec(
            run_id=run_id,
            environment=TINKER_API,
            env_file="",
            env_class="",
            config_hash=config_hash,
            config=config,
        )
        RunFolder(run_dir).create(spec)
        with write_session(self._engine) as db:
            run = Run(
                id=run_id,
                environment=TINKER_API,
                status=RunStatus.starting,
                config_json=json.dumps(config, sort_keys=True),
                config_hash=config_hash,
                run_dir=str(run_dir),
                source=TINKER_API,
                launcher=TINKER_API,
                # The process holding the session: the server (its engine dies with it).
                pid=self._pid,
                process_start=self._start,
            )
            db.add(run)
            lifecycle.transition(db, run, RunStatus.running)
        return run_id, run_dir

    def add_model(self, run_id: str, seq: int, model: dict[str, Any]) -> None:
        """A training client of the session: in its config (the first one names the run's
        model, as `model_name` does for our runs)."""
        with write_session(self._engine) as db:
            run = db.get(Run, run_id)
            if run is None:
                return
            config = json.loads(run.config_json)
            config["models"][str(seq)] = model
            config.setdefault("model_name", model["base_model"])
            config.setdefault("lora_rank", model.get("lora_rank"))
            run.config_json = json.dumps(config, sort_keys=True)
            run.config_hash = hash_config(config)
            db.add(run)

    def set_project(self, run_id: str, project_id: str) -> None:
        """The session's project (assign_session_project), kept with what create_session sent."""
        with write_session(self._engine) as db:
            run = db.get(Run, run_id)
            if run is None:
                return
            config = json.loads(run.config_json)
            config.setdefault("session", {})["project_id"] = project_id
            run.config_json = json.dumps(config, sort_keys=True)
            run.config_hash = hash_config(config)
            db.add(run)

    def step(self, run_id: str, step: int, metrics: dict[str, float]) -> None:
        lifecycle.record_step(self._engine, run_id, step, metrics)

    def checkpoint(
        self,
        run_id: str,
        step: int,
        kind: str,
        name: str,
        folder: str,
        expires_at: datetime | None = None,
    ) -> None:
        lifecycle.record_checkpoint(self._engine, run_id, step, kind, name, folder, expires_at)

    def forget_checkpoint(self, run_id: str, folder: str) -> None:
        with write_session(self._engine) as db:
            db.exec(
                delete(Checkpoint).where(
                    col(Checkpoint.run_id) == run_id, col(Checkpoint.path) == folder
                )
            )

    def update_checkpoint(self, run_id: str, folder: str, **fields: Any) -> Checkpoint | None:
        """Set a checkpoint row's fields (public, expires_at); the row, None if there is none."""
        with write_session(self._engine) as db:
            row = db.exec(
                select(Checkpoint).where(
                    col(Checkpoint.run_id) == run_id, col(Checkpoint.path) == folder
                )
            ).first()
            if row is None:
                return None
            for key, value in fields.items():
                setattr(row, key, value)
            db.add(row)
            db.flush()
            db.refresh(row)
            db.expunge(row)
        return row

    def expired(self, now: datetime) -> list[Checkpoint]:
        """Tinker sessions' checkpoints whose time to live passed before `now`."""
        with read_session(self._engine) as db:
            rows = db.exec(
                select(Checkpoint)
                .join(Run, col(Run.id) == col(Checkpoint.run_id))
                .where(col(Run.source) == TINKER_API, col(Checkpoint.expires_at) < now)
            ).all()
        return list(rows)

    def end(self, run_id: str, status: RunStatus, kind: str | None, details: str) -> None:
        """The session's end; a run stopped meanwhile (POST /runs/{id}/stop) ends stopped."""
        with write_session(self._engine) as db:
            run = db.get(Run, run_id)
            if run is None or RunStatus(run.status) in FINISHED:
                return
            if run.status == RunStatus.stopping and status != RunStatus.stopped:
                status, kind = RunStatus.stopped, None
            lifecycle.transition(db, run, status, failure_kind=kind, details=details)

    def log(self, run_dir: Path, line: str) -> None:
        """A line of the session's story in its run's log (GET /runs/{id}/logs)."""
        stamp = iso(utcnow())
        with (run_dir / "train.log").open("a") as log_file:
            log_file.write(f"{stamp} {line}\n")

    def rollouts(self, run_dir: Path, run_id: str, step: int, records: list[RolloutRecord]) -> None:
        """A step's samples and datums as its rollouts, bounded as our runs' are (the defaults
        of rollouts_per_step and rollouts_max_mb); a failed write is a line in its log."""
        try:
            picked = rollouts.pick(records, rollouts.DEFAULT_PER_STEP, seed=step)
            max_bytes = int(rollouts.DEFAULT_MAX_MB * rollouts.MB)
            rollout_store.write_step(
                self._engine, run_id, step, picked, sampled=records, max_bytes=max_bytes
            )
        except Exception as exc:  # the session goes on without its record of this step
            self.log(run_dir, f"step {step}: its rollouts were not recorded ({exc})")

    def write_trace(self, run_dir: Path, trace: dict[str, Any]) -> None:
        """The session's request trace, kept in its run's folder once it ended."""
        durable.write_json_atomic(run_dir / TRACE_FILE, trace)

    def read_trace(self, run_dir: Path) -> dict[str, Any] | None:
        try:
            return dict(json.loads((run_dir / TRACE_FILE).read_text()))
        except (OSError, ValueError):
            return None

    # Reading -----------------------------------------------------------------------------

    def stopping(self, run_ids: list[str]) -> list[str]:
        """Those of `run_ids` someone asked to stop (on any server sharing the database)."""
        if not run_ids:
            return []
        with read_session(self._engine) as db:
            rows = db.exec(
                select(Run.id).where(
                    col(Run.id).in_(run_ids), col(Run.status) == RunStatus.stopping
                )
            ).all()
        return list(rows)

    def run(self, run_id: str) -> Run | None:
        with read_session(self._engine) as db:
            run = db.get(Run, run_id)
        return run if run is not None and run.source == TINKER_API else None

    def runs(self, limit: int, offset: int) -> tuple[list[Run], int]:
        with read_session(self._engine) as db:
            ours = col(Run.source) == TINKER_API
            total = db.exec(select(func.count()).select_from(Run).where(ours)).one()
            rows = db.exec(
                select(Run)
                .where(ours)
                .order_by(col(Run.created_at).desc(), col(Run.id).desc())
                .offset(offset)
                .limit(limit)
            ).all()
        return list(rows), total

    def step_metrics(self, start: datetime, end: datetime) -> list[tuple[Run, Metric]]:
        """Tinker sessions' recorded steps between `start` and `end` (billing reads them)."""
        with read_session(self._engine) as db:
            rows = db.exec(
                select(Run, Metric)
                .join(Metric, col(Metric.run_id) == col(Run.id))
                .where(
                    col(Run.source) == TINKER_API,
                    col(Metric.created_at) >= start,
                    col(Metric.created_at) < end,
                )
                .order_by(col(Metric.created_at))
            ).all()
        return [(run, metric) for run, metric in rows]

    def checkpoints(self, run_ids: list[str] | None = None) -> list[Checkpoint]:
        with read_session(self._engine) as db:
            query = (
                select(Checkpoint)
                .join(Run, col(Run.id) == col(Checkpoint.run_id))
                .where(col(Run.source) == TINKER_API)
            )
            if run_ids is not None:
                query = query.where(col(Checkpoint.run_id).in_(run_ids))
            rows = db.exec(query.order_by(col(Checkpoint.created_at).desc())).all()
        return list(rows)


class Recorder:
    """SessionRecords' writes, from the event loop, done in order by one thread; reads on the
    same thread, after the writes before them."""

    def __init__(self, records: SessionRecords) -> None:
        self.records = records
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-db")

    def log(self, run_dir: Path, line: str) -> None:
        self._thread.submit(self.records.log, run_dir, line)

    def model(self, run_id: str, seq: int, model: dict[str, Any]) -> None:
        self._thread.submit(self.records.add_model, run_id, seq, model)

    def step(self, run_id: str, step: int, metrics: dict[str, Any]) -> None:
        self._thread.submit(self.records.step, run_id, step, metrics)

    def checkpoint(
        self,
        run_id: str,
        step: int,
        kind: str,
        name: str,
        folder: str,
        expires_at: datetime | None = None,
    ) -> None:
        self._thread.submit(self.records.checkpoint, run_id, step, kind, name, folder, expires_at)

    def end(self, run_id: str, status: RunStatus, kind: str | None, details: str) -> None:
        self._thread.submit(self.records.end, run_id, status, kind, details)

    def rollouts(self, run_dir: Path, run_id: str, step: int, records: list[RolloutRecord]) -> None:
        self._thread.submit(self.records.rollouts, run_dir, run_id, step, records)

    def trace(self, run_dir: Path, trace: dict[str, Any]) -> None:
        self._thread.submit(self.records.write_trace, run_dir, trace)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def written(self) -> None:
        """Once every write submitted so far is done."""
        await self.read(lambda: None)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
