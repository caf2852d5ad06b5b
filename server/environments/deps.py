"""The environments domain's services, as its routes depend on them (read from the app's
container, which they need not import)."""

from __future__ import annotations

from server.environments.catalog import Catalog
from server.environments.configs import ConfigService
from server.service_of import service_of

catalog = service_of("catalog", Catalog)

config_service = service_of("configs", ConfigService)
