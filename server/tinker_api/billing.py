"""Billing as the SDK's AdminClient reads it (`tinker billing usage`, `checkpoint-storage`),
from what Tinker sessions recorded here: each optimizer step's tokens trained
(`train/tokens`), tokens sampled since the step before (`sampler/tokens`) and device seconds
(`time/device_s`), summed per UTC hour, base model and session; and the bytes their
checkpoints hold now. Nothing is priced: costs and rates are null, as the SDK allows."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from server.errors import BadRequest
from server.tinker_api.schemas import JsonObject
from server.tinker_api.sessions.records import SessionRecords
from server.tinker_api.sessions_view import OWNER
from server.tinker_api.sizes import folder_bytes

MAX_WINDOW = timedelta(days=14)  # the SDK's bound
GIB = 1 << 30


class TinkerBilling:
    def __init__(self, records: SessionRecords) -> None:
        self._records = records

    def usage(self, starting_on: datetime, ending_before: datetime) -> JsonObject:
        start, end = _utc(starting_on), _utc(ending_before)
        for field, value in (("starting_on", start), ("ending_before", end)):
            if value != value.replace(minute=0, second=0, microsecond=0):
                raise BadRequest(f"{field}: {value.isoformat()} is not on a UTC hour boundary")
        if not start < end <= start + MAX_WINDOW:
            raise BadRequest("ending_before: must come after starting_on, at most 14 days later")
        buckets: dict[tuple[datetime, str, str], dict[str, float]] = defaultdict(
            lambda: defaultdict(float)
        )
        sessions: dict[str, Any] = {}
        for run, metric in self._records.step_metrics(start, end):
            config = json.loads(run.config_json)
            hour = _utc(metric.created_at).replace(minute=0, second=0, microsecond=0)
            values = json.loads(metric.values_json)
            bucket = buckets[(hour, str(config.get("model_name") or ""), run.id)]
            for key in ("train/tokens", "sampler/tokens", "time/device_s"):
                bucket[key] += float(values.get(key) or 0.0)
            meta = (config.get("session") or {}).get("user_metadata")
            sessions[run.id] = {"user_metadata": _strings(meta)}
        data = []
        for (hour, model, session_id), totals in sorted(buckets.items()):
            envelope = {
                "bucket_start": hour.isoformat(),
                "bucket_end": (hour + timedelta(hours=1)).isoformat(),
                "base_model": model or None,
                "user_id": OWNER,
                "session_id": session_id,
                "estimated_cost_usd": None,
                "effective_rate_usd_per_million_tokens": None,
                # Not in the SDK's types (it ignores the field): the session's device time.
                "device_seconds": round(totals["time/device_s"], 3),
            }
            for kind, key in (("training", "train/tokens"), ("sampling_sample", "sampler/tokens")):
                if totals[key]:
                    info = {"type": kind, "token_count": int(totals[key])}
                    data.append({**envelope, "event_info": info})
        return {"data": data, "sessions": sessions, "cost_data_through": None}

    def checkpoint_storage(self, project_id: str | None) -> JsonObject:
        groups: dict[str, list[int]] = defaultdict(list)
        runs: dict[str, str] = {}
        for row in self._records.checkpoints():
            if row.run_id not in runs:
                run = self._records.run(row.run_id)
                config = json.loads(run.config_json) if run is not None else {}
                runs[row.run_id] = str((config.get("session") or {}).get("project_id") or "")
            project = runs[row.run_id]
            if project_id is None or project == project_id:
                groups[project].append(folder_bytes(Path(row.path)) or 0)
        data = [
            {
                "project_id": project or None,
                "org_user_urn": OWNER,
                "checkpoint_count": len(sizes),
                "size_bytes": sum(sizes),
                "size_gigabytes": sum(sizes) / GIB,
                "estimated_monthly_cost_usd": None,
            }
            for project, sizes in sorted(groups.items())
        ]
        return {"effective_rate_usd_per_gigabyte_month": None, "data": data}


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _strings(values: Any) -> dict[str, str] | None:
    if not isinstance(values, dict):
        return None
    return {str(k): str(v) for k, v in values.items()}
