"""The sweeps domain's service, as its routes depend on it (read from the app's container,
which they need not import)."""

from __future__ import annotations

from server.service_of import service_of
from server.sweeps.service import SweepService

sweep_service = service_of("sweeps", SweepService)
