"""The /v1 face's service, as its routes depend on it (read from the app's container, which
they need not import)."""

from __future__ import annotations

from fastapi import Request

from server.openai_compat.chat import ChatService


def chat_service(request: Request) -> ChatService:
    service: ChatService = request.app.state.services.chat
    return service
