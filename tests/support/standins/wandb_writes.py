"""The write side of the W&B stand-in: what the real `wandb` client (wandb-core 0.31) sends
while a run is online, applied to the stand-in's runs so that `wandb.Api` reads it back.

- GraphQL: RunResumeStatus, UpsertBucket, CreateRunFiles and RewindRun, plus the probes
  wandb-core makes before them (OrganizationCoreWeaveOrganizationID, ServerFeaturesQuery);
- POST /files/<entity>/<project>/<run>/file_stream: history rows, the summary, the exit;
- PUT to the upload URLs CreateRunFiles handed out (config.yaml, wandb-metadata.json, ...).

`WriteSide` is a mixin of `WandbStandin`: it shares the stand-in's runs, lock and URL.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

if TYPE_CHECKING:
    from tests.support.standins.wandb_standin import StandinRun

FILE_STREAM_RE = re.compile(r"^/files/([^/]+)/([^/]+)/([^/]+)/file_stream$")
UPLOAD_PREFIX = "/storage/"

WRITE_OPERATIONS = frozenset(
    {
        "RunResumeStatus",
        "UpsertBucket",
        "CreateRunFiles",
        "RewindRun",
        "OrganizationCoreWeaveOrganizationID",
        "ServerFeaturesQuery",
    }
)

# The file_stream "files" kept; wandb-events.jsonl (system metrics) and output.log (console)
# are accepted and dropped.
HISTORY_FILE = "wandb-history.jsonl"  # one JSON row per line, written at `offset`
SUMMARY_FILE = "wandb-summary.json"  # the whole summary, always as one line

# What the client expects back from a file_stream POST (it only checks that it is JSON).
FILE_STREAM_ANSWER: dict[str, Any] = {"exitcode": None, "limits": {}}


class StandinError(Exception):
    """An answer other than 200 (the caller turns it into a GraphQL error)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class WriteSide:
    """Runs written by the real client; mixed into `WandbStandin`."""

    # Provided by WandbStandin / LoopbackServer.
    _runs: dict[tuple[str, str, str], StandinRun]
    _lock: threading.Lock
    _changed: threading.Condition
    url: str
    entity: str

    def _init_write_side(self) -> None:
        # Flags answered enabled in ServerFeaturesQuery. FILESTREAM_GZIP makes wandb-core
        # gzip its file_stream posts, as it does against hosted W&B.
        self.server_features: set[str] = {"FILESTREAM_GZIP"}
        self.file_stream_posts: list[dict[str, Any]] = []  # decoded bodies, in order
        self.file_stream_gzipped = 0  # how many of them came gzip-compressed
        self._upload_tokens: dict[str, tuple[tuple[str, str, str], str]] = {}

    def _new_run(self, entity: str, project: str, run_id: str) -> StandinRun:
        raise NotImplementedError  # WandbStandin builds its StandinRun

    # Reading what was written ---------------------------------------------------------

    def wait_for_run(
        self,
        entity: str,
        project: str,
        run_id: str,
        predicate: Callable[[StandinRun], bool],
        timeout_s: float = 10.0,
    ) -> bool:
        """Block until the run exists and `predicate(run)` holds (True) or time ran out."""

        def holds() -> bool:
            run = self._runs.get((entity, project, run_id))
            return run is not None and predicate(run)

        with self._changed:
            return self._changed.wait_for(holds, timeout=timeout_s)

    # GraphQL (called with the request already authorized) ------------------------------

    def _answer_write(self, operation: str, variables: dict[str, Any]) -> dict[str, Any]:
        if operation == "ServerFeaturesQuery":
            features = [{"name": name, "isEnabled": True} for name in sorted(self.server_features)]
            return {"serverInfo": {"features": features}}
        if operation == "OrganizationCoreWeaveOrganizationID":
            return {"entity": {"organization": None}}
        if operation == "RunResumeStatus":
            return {"model": self._resume_status(variables)}
        if operation == "UpsertBucket":
            return {"upsertBucket": self._upsert_bucket(variables)}
        if operation == "CreateRunFiles":
            return {"createRunFiles": self._create_run_files(variables)}
        if operation == "RewindRun":
            return {"rewindRun": {"rewoundRun": self._rewind(variables)}}
        raise StandinError(400, f"the W&B stand-in does not implement operation {operation!r}")

    def _resume_status(self, variables: dict[str, Any]) -> dict[str, Any] | None:
        entity, project = str(variables.get("entity")), str(variables.get("project"))
        key = (entity, project, str(variables.get("name")))
        with self._lock:
            if not any(k[:2] == key[:2] for k in self._runs):
                return None  # no such project yet: the client creates the run
            run = self._runs.get(key)
            bucket = None
            if run is not None:
                # What `resume="allow"` reads to carry on: the last row tells it the next step.
                bucket = {
                    "id": _storage_id(run),
                    "name": run.run_id,
                    "displayName": run.display_name,
                    "summaryMetrics": json.dumps(run.summary),
                    "logLineCount": 0,
                    "historyLineCount": len(run.history),
                    "eventsLineCount": 0,
                    "historyTail": json.dumps([json.dumps(row) for row in run.history[-10:]]),
                    "eventsTail": "[]",
                    "config": _wire_config(run.config),
                    "tags": list(run.tags),
                    "notes": None,
                    # wandb-core resumes only a run whose `_wandb` config has "t" (one a
                    # client started); a run seeded with add_run counts as one too.
                    "wandbConfig": json.dumps({"t": _wandb_config(run).get("t", {})}),
                }
            return {
                "id": "UHJvamVjdDox",
                "name": project,
                "entity": {"id": "RW50aXR5OjE=", "name": entity},
                "bucket": bucket,
            }

    def _upsert_bucket(self, variables: dict[str, Any]) -> dict[str, Any]:
        entity = str(variables.get("entity") or self.entity)
        project = str(variables.get("project") or "uncategorized")
        run_id = variables.get("name")
        if not run_id:
            raise StandinError(400, "UpsertBucket without a run name")
        key = (entity, project, str(run_id))
        with self._changed:
            run = self._runs.get(key)
            inserted = run is None
            if run is None:
                run = self._runs[key] = self._new_run(*key)
            if variables.get("displayName"):
                run.display_name = str(variables["displayName"])
            if variables.get("config"):
                # Sent as a JSON string of {"key": {"value": ..., "desc": ...}}.
                for name, entry in json.loads(variables["config"]).items():
                    run.config[name] = entry.get("value") if isinstance(entry, dict) else entry
            if variables.get("summaryMetrics"):
                run.summary.update(json.loads(variables["summaryMetrics"]))
            if variables.get("state"):
                run.state = str(variables["state"])
            if variables.get("tags") is not None:
                run.tags = list(variables["tags"])
            self._changed.notify_all()
            return {"bucket": _bucket(run), "inserted": inserted}

    def _create_run_files(self, variables: dict[str, Any]) -> dict[str, Any]:
        key = (str(variables.get("entity")), str(variables.get("project")), str(variables["run"]))
        files = []
        with self._lock:
            if key not in self._runs:
                raise StandinError(404, f"run {'/'.join(key)} not found")
            for name in variables.get("files") or []:
                # Like a presigned URL: the token alone lets its holder upload this one file.
                token = secrets.token_urlsafe(12)
                self._upload_tokens[token] = (key, str(name))
                url = f"{self.url}{UPLOAD_PREFIX}{token}/{quote(str(name))}"
                files.append({"name": name, "uploadUrl": url})
        return {"runID": storage_id(*key), "uploadHeaders": [], "files": files}

    def _rewind(self, variables: dict[str, Any]) -> dict[str, Any] | None:
        """What hosted W&B does for `resume_from="<run>?_step=N"`: rows past N go, the summary
        is rebuilt from the rows left, and the run (same id) takes new rows from N + 1 on."""
        metric = str(variables.get("metricName"))
        if metric != "_step":
            raise StandinError(400, f"rewind is only supported on _step, not {metric!r}")
        entity = str(variables.get("entity") or self.entity)
        key = (entity, str(variables.get("project")), str(variables.get("runName")))
        value = float(variables["metricValue"])
        with self._changed:
            run = self._runs.get(key)
            if run is None:
                return None  # the client reports "run not found"
            run.history = [row for row in run.history if row.get("_step", -1) <= value]
            run.summary = _summary_of(run.history)
            run.state = "running"
            run.exitcode = None
            run.rewinds.append(value)
            self._changed.notify_all()
            return _bucket(run)

    # file_stream and uploads (called from handler threads) -----------------------------

    def handle_file_stream(
        self, entity: str, project: str, run_id: str, raw: bytes, content_encoding: str | None
    ) -> int:
        """Apply one file_stream POST; the answer status (the body is FILE_STREAM_ANSWER)."""
        gzipped = (content_encoding or "").strip().lower() == "gzip"
        try:
            data = json.loads((gzip.decompress(raw) if gzipped else raw) or b"{}")
        except (OSError, EOFError, json.JSONDecodeError):
            return 400
        key = (unquote(entity), unquote(project), unquote(run_id))
        with self._changed:
            self.file_stream_posts.append(data)
            self.file_stream_gzipped += gzipped
            run = self._runs.get(key)
            if run is None:
                return 404
            files = data.get("files") or {}
            history = files.get(HISTORY_FILE)
            if history:
                _write_history(run, int(history.get("offset", 0)), history.get("content") or [])
            summary = files.get(SUMMARY_FILE)
            if summary and summary.get("content"):
                # The client always sends the whole summary as one line; the last line wins.
                run.summary = json.loads(summary["content"][-1])
            elif history:
                for line in history.get("content") or []:
                    run.summary.update(json.loads(line))
            run.uploaded.extend(data.get("uploaded") or [])
            if data.get("complete") or data.get("exitcode") is not None:
                run.exitcode = int(data.get("exitcode") or 0)
                # W&B marks a run that exited non-zero "failed" ("crashed" is a lost heartbeat).
                run.state = "finished" if run.exitcode == 0 else "failed"
            else:
                # Any other post is a heartbeat: a resumed run is running again.
                run.state, run.exitcode = "running", None
            run.heartbeat_at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
            self._changed.notify_all()
        return 200

    def handle_upload(self, path: str, body: bytes) -> int:
        """Accept a PUT to an upload URL handed out by CreateRunFiles."""
        token, _, _name = path[len(UPLOAD_PREFIX) :].partition("/")
        with self._changed:
            issued = self._upload_tokens.get(token)
            if issued is None:
                return 403
            key, name = issued
            run = self._runs.get(key)
            if run is None:
                return 404
            run.files[name] = body
            self._changed.notify_all()
        return 200


def _write_history(run: StandinRun, offset: int, lines: list[str]) -> None:
    rows = [json.loads(line) for line in lines]
    # Lines land at their line number, so a retried post rewrites rather than duplicates;
    # an offset past the end (a lost post) still appends, in order.
    offset = min(offset, len(run.history))
    run.history[offset : offset + len(rows)] = rows


def _summary_of(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary W&B rebuilds from history: the last value of every key."""
    summary: dict[str, Any] = {}
    for row in history:
        summary.update(row)
    return summary


def _wandb_config(run: StandinRun) -> dict[str, Any]:
    value = run.config.get("_wandb")
    return value if isinstance(value, dict) else {}


def _wire_config(config: dict[str, Any]) -> str:
    return json.dumps({k: {"value": v, "desc": None} for k, v in config.items()})


def storage_id(entity: str, project: str, run_id: str) -> str:
    """A run's GraphQL id, as the backend makes it (base64 of "Run:<path>")."""
    raw = f"Run:{entity}/{project}/{run_id}".encode()
    return base64.b64encode(raw).decode().rstrip("=")


def _storage_id(run: StandinRun) -> str:
    return storage_id(run.entity, run.project, run.run_id)


def _bucket(run: StandinRun) -> dict[str, Any]:
    """The fields of the Run (bucket) type that UpsertBucket and RewindRun ask for."""
    return {
        "id": _storage_id(run),
        "name": run.run_id,
        "displayName": run.display_name,
        "description": None,
        "config": _wire_config(run.config),
        "sweepName": None,
        "project": {
            "id": "UHJvamVjdDox",
            "name": run.project,
            "entity": {"id": "RW50aXR5OjE=", "name": run.entity},
        },
        "historyLineCount": len(run.history),
    }
