"""The /v1 face's service, as its routes depend on it (read from the app's container, which
they need not import)."""

from __future__ import annotations

from server.openai_compat.chat import ChatService
from server.service_of import service_of

chat_service = service_of("chat", ChatService)
