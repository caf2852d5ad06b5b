"""The runs domain's services, as its routes depend on them (read from the app's container,
which they need not import)."""

from __future__ import annotations

from server.runs.export import ExportService
from server.runs.forks import ForkService
from server.runs.logs import StreamSlots
from server.runs.rollouts import RolloutService
from server.runs.service import RunService
from server.service_of import service_of

run_service = service_of("runs", RunService)

fork_service = service_of("forks", ForkService)

stream_slots = service_of("streams", StreamSlots)

export_service = service_of("export", ExportService)

rollout_service = service_of("rollouts", RolloutService)
