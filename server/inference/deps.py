"""The inference domain's service, as its route depends on it (read from the app's container,
which it need not import)."""

from __future__ import annotations

from server.inference.service import InferenceService
from server.service_of import service_of

inference_service = service_of("inference", InferenceService)
