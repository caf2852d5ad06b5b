"""The server's state in one look: what GET /health answers, and /mcp's rl_health."""

from __future__ import annotations

from server import __version__
from server.container import Services
from server.health.schemas import HealthOut


def health_report(svc: Services) -> HealthOut:
    return HealthOut(
        status="ok",
        version=__version__,
        backend=svc.settings.default_backend,
        environments=svc.catalog.count(),
        active_runs=svc.runs.count_active(),
        supervisor=svc.supervisor.role,
        launcher=svc.supervisor.launcher_health(),
    )
