"""Resources: `run://{id}/log` (the tail of a run's log, text) and `run://{id}/metrics` (what
GET /runs/{id}/metrics answers, JSON); the newest runs' are listed, any run's can be read."""

from __future__ import annotations

import asyncio
import json
import re

from mcp import types
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.shared.exceptions import McpError
from pydantic import AnyUrl

from server.container import Services
from server.errors import DomainError, NotFound

LOG_TAIL = 200  # lines: what fits an agent's context; GET /runs/{id}/logs?tail= reads more
LISTED = 20  # newest runs whose resources resources/list names
RESOURCE_NOT_FOUND = -32002  # the MCP spec's code for an unknown resource
_URI = re.compile(r"^run://(?P<run_id>[^/]{1,64})/(?P<kind>log|metrics)$")

TEMPLATES = [
    types.ResourceTemplate(
        uriTemplate="run://{run_id}/log",
        name="run-log",
        title="Run log (tail)",
        description=f"The last {LOG_TAIL} lines of a run's training log",
        mimeType="text/plain",
    ),
    types.ResourceTemplate(
        uriTemplate="run://{run_id}/metrics",
        name="run-metrics",
        title="Run metrics",
        description="A run's final (or latest) metrics, recent history and checkpoints (JSON)",
        mimeType="application/json",
    ),
]


def listed(svc: Services) -> list[types.Resource]:
    found = []
    for run in svc.runs.list(limit=LISTED):
        found += [
            types.Resource(
                uri=AnyUrl(f"run://{run.run_id}/log"),
                name=f"{run.run_id} log",
                mimeType="text/plain",
            ),
            types.Resource(
                uri=AnyUrl(f"run://{run.run_id}/metrics"),
                name=f"{run.run_id} metrics",
                mimeType="application/json",
            ),
        ]
    return found


async def read(svc: Services, uri: AnyUrl) -> list[ReadResourceContents]:
    match = _URI.match(str(uri))
    if match is None:
        raise McpError(
            types.ErrorData(
                code=types.INVALID_PARAMS,
                message=f"uri: '{str(uri)[:80]}' is not a resource here; use run://<run_id>/log "
                "or run://<run_id>/metrics (rl_list_runs lists run ids).",
            )
        )
    run_id, kind = match["run_id"], match["kind"]
    try:
        if kind == "log":
            answer = await asyncio.to_thread(svc.runs.logs, run_id, LOG_TAIL)
            return [ReadResourceContents("\n".join(answer.lines), "text/plain")]
        results = await asyncio.to_thread(svc.runs.results, run_id)
    except DomainError as exc:
        code = RESOURCE_NOT_FOUND if isinstance(exc, NotFound) else types.INVALID_PARAMS
        raise McpError(types.ErrorData(code=code, message=exc.detail)) from None
    data = results.model_dump(mode="json")
    return [ReadResourceContents(json.dumps(data, indent=2), "application/json")]
