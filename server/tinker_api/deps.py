"""The Tinker API's services, as its routes depend on them (read from the app's container,
which they need not import)."""

from __future__ import annotations

from server.service_of import service_of
from server.tinker_api.rest import TinkerRest
from server.tinker_api.service import TinkerService

tinker_service = service_of("tinker", TinkerService)

tinker_rest = service_of("tinker_rest", TinkerRest)
