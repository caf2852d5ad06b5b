"""Tinker sessions as the RestClient and `tinker session` see them: they are our runs of source
tinker-api, listed, read, searched (newest first, with the SDK's filters) and moved between
projects (recorded in the run's config; this server keeps no projects of its own), and a
session's trace of its requests exported as a signed download."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.models import Run, RunStatus
from server.errors import BadRequest, NotFound
from server.tinker_api import paths
from server.tinker_api.downloads import DownloadSigner
from server.tinker_api.schemas import JsonObject, SessionSearchIn
from server.tinker_api.sessions.hub import SessionHub
from server.tinker_api.sessions.records import SessionRecords
from server.tinker_api.sizes import folder_bytes

OWNER = "local"  # every session here is this server's one user's
MAX_SESSIONS = 10_000  # read for a search; older ones are not searched
CLOSED = re.compile(r"the script closed its session \((success|errored|interrupted)\)")


class TinkerSessions:
    def __init__(self, hub: SessionHub, signer: DownloadSigner) -> None:
        self._hub = hub
        self._records: SessionRecords = hub.records
        self._signer = signer

    def list(self, limit: int, offset: int) -> JsonObject:
        runs, _ = self._records.runs(limit, offset)
        return {"sessions": [run.id for run in runs]}

    def get(self, session_id: str) -> JsonObject:
        run = self._run(session_id)
        config = _config(run)
        live = self._hub.sessions.get(run.id)
        meta = config.get("session") or {}
        return {
            "training_run_ids": [m["model_id"] for m in (config.get("models") or {}).values()],
            "sampler_ids": list(live.samplers) if live is not None else [],
            "user_metadata": _strings(meta.get("user_metadata")),
            "display_name": meta.get("display_name"),
        }

    def search(self, body: SessionSearchIn) -> JsonObject:
        runs, _ = self._records.runs(MAX_SESSIONS, 0)
        after = body.cursor
        found: list[JsonObject] = []
        for run in runs:  # newest first: (created_at, id) descending
            created = _utc(run.created_at)
            if after is not None and (created, run.id) >= (
                _utc(after.last_created_at),
                after.last_session_id,
            ):
                continue
            summary = self._summary(run)
            if _matches(body, run, summary):
                found.append(summary)
                if len(found) > body.limit:
                    break
        page, more = found[: body.limit], len(found) > body.limit
        cursor = (
            {"last_created_at": page[-1]["created_at"], "last_session_id": page[-1]["session_id"]}
            if more
            else None
        )
        return {"sessions": page, "next_cursor": cursor}

    def set_project(self, session_id: str, project_id: str) -> None:
        if not project_id:
            raise BadRequest("project_id: give the project to move the session into")
        self._run(session_id)
        self._records.set_project(session_id, project_id)

    # Traces ------------------------------------------------------------------------------

    def trace_export(self, session_id: str, base_url: str) -> JsonObject:
        """The poll answer of `export_session_trace`: ready at once, with a signed URL."""
        run = self._run(session_id)
        if self._trace(run) is None:
            return {"status": "failed", "error": f"session {run.id} left no trace of its requests"}
        url, _ = self._signer.url(base_url, f"traces/{run.id}")
        return {"status": "ready", "url": url}

    def trace_file(self, session_id: str, expires: int, signature: str) -> dict[str, Any]:
        self._signer.check(f"traces/{session_id}", expires, signature)
        trace = self._trace(self._run(session_id))
        if trace is None:
            raise NotFound(f"session_id: session {session_id} left no trace of its requests")
        return trace

    # Helpers -----------------------------------------------------------------------------

    def _run(self, session_id: str) -> Run:
        run = (
            self._records.run(session_id) if paths.parse_model_id(f"{session_id}:train:0") else None
        )
        if run is None:
            raise NotFound(f"session_id: no Tinker session {session_id[:80]} on this server")
        return run

    def _trace(self, run: Run) -> dict[str, Any] | None:
        live = self._hub.sessions.get(run.id)
        if live is not None and live.ended is None:
            return live.trace.chrome_trace(run.id)
        return self._records.read_trace(Path(run.run_dir))

    def _summary(self, run: Run) -> JsonObject:
        config = _config(run)
        meta = config.get("session") or {}
        rows = self._records.checkpoints([run.id])
        sizes = [folder_bytes(Path(row.path)) or 0 for row in rows]
        return {
            "session_id": run.id,
            "created_at": _utc(run.created_at).isoformat(),
            "owner": OWNER,
            "project_id": str(meta.get("project_id") or ""),
            "status": _status(run),
            "checkpoints_count": len(rows),
            "display_name": meta.get("display_name"),
            "user_metadata": _strings(meta.get("user_metadata")),
            "checkpoint_storage_bytes": sum(sizes),
        }


def _status(run: Run) -> JsonObject | None:
    """A run's status as the SDK's SessionStatus."""
    status = RunStatus(run.status)
    closed = CLOSED.search(run.details or "")
    if status in (RunStatus.running, RunStatus.starting, RunStatus.queued):
        return {"type": "active"}
    if closed is not None:
        return {"type": "client_finished", "reason": {"type": closed[1]}, "detail": run.details}
    if status == RunStatus.stopped:
        return {"type": "cancelled", "detail": run.details}
    if status == RunStatus.succeeded:  # ended without closing, every request answered
        return None
    if status == RunStatus.failed:
        models = list((_config(run).get("models") or {}).values())
        return {
            "type": "failed",
            "category": "internal",
            "reason": {
                "type": "training_run",
                "training_run_id": models[0]["model_id"] if models else run.id,
            },
            "message": run.details or str(run.failure_kind),
        }
    return None


def _matches(body: SessionSearchIn, run: Run, summary: JsonObject) -> bool:
    by_id = body.session_id is not None and body.session_id == run.id
    name = (summary["display_name"] or "").lower()
    by_name = body.display_name is not None and all(
        word in name for word in body.display_name.lower().split()
    )
    if (body.session_id is not None or body.display_name is not None) and not (by_id or by_name):
        return False
    if body.project_ids is not None and summary["project_id"] not in body.project_ids:
        return False
    metadata = summary["user_metadata"] or {}
    if any(metadata.get(k) != v for k, v in body.user_metadata.items()):
        return False
    if body.owner.get("type") == "user" and OWNER not in body.owner.get("owner_urns", []):
        return False
    if body.statuses is not None:
        status = summary["status"]
        return any(_status_matches(query, status) for query in body.statuses)
    return True


def _status_matches(query: dict[str, Any], status: JsonObject | None) -> bool:
    if status is None or query.get("type") != status["type"]:
        return False
    reasons = query.get("reasons")
    return not reasons or status.get("reason", {}).get("type") in reasons


def _config(run: Run) -> dict[str, Any]:
    try:
        config = json.loads(run.config_json)
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def _strings(values: Any) -> dict[str, str] | None:
    if not isinstance(values, dict):
        return None
    return {str(k): str(v) for k, v in values.items()}


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)
