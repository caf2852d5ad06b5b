"""GET /v1/models and POST /v1/chat/completions: an OpenAI-compatible face on base models and
runs' checkpoints, for OpenAI clients (base_url http://host:port/v1, api_key = the token);
and vLLM's token-in, token-out POST /inference/v1/generate beside it."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from server.openai_compat.chat import ChatService
from server.openai_compat.chat_stream import stream
from server.openai_compat.deps import chat_service
from server.openai_compat.generate import GenerateIn, GenerateOut
from server.openai_compat.schemas import ChatCompletionIn, ChatCompletionOut, ModelListOut

router = APIRouter(prefix="/v1", tags=["openai"])
inference_router = APIRouter(prefix="/inference/v1", tags=["openai"])

Chat = Annotated[ChatService, Depends(chat_service)]
CHAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The completion; with stream=true, server-sent chunks as OpenAI sends",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


@router.get("/models")
async def list_models(chat: Chat) -> ModelListOut:
    data = await asyncio.to_thread(chat.models.listing)
    return ModelListOut(data=data)


@router.post("/chat/completions", response_model=ChatCompletionOut, responses=CHAT_RESPONSES)
async def chat_completions(
    body: ChatCompletionIn, chat: Chat, request: Request
) -> ChatCompletionOut | StreamingResponse:
    prepared = await asyncio.to_thread(chat.prepare, body)
    if body.stream:
        return StreamingResponse(
            stream(chat, prepared),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await chat.complete(prepared, request.is_disconnected)


@inference_router.post("/generate")
async def generate(body: GenerateIn, chat: Chat, request: Request) -> GenerateOut:
    prepared = await asyncio.to_thread(chat.prepare_generate, body)
    return await chat.generate(prepared, request.is_disconnected)
