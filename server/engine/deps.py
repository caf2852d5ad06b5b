"""The engine domain's service, as its route depends on it (read from the app's container,
which it need not import)."""

from __future__ import annotations

from server.engine.service import EngineService
from server.service_of import service_of

engine_service = service_of("engine_status", EngineService)
