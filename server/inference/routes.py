"""POST /test/inference: sample a model (or a run's adapter) on prompts and score them."""

# No `from __future__ import annotations`: FastAPI must see the body model built below, which a
# string annotation naming a local variable would hide from it.
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from server.inference.deps import inference_service
from server.inference.schemas import InferenceOut, inference_in
from server.inference.service import InferenceService


def router_for(max_prompts: int) -> APIRouter:
    """The route, its body capped at `max_prompts` prompts (RLCS_INFERENCE_MAX_PROMPTS)."""
    router = APIRouter(tags=["inference"])
    body_model = inference_in(max_prompts)

    @router.post("/test/inference")
    async def test_inference(
        body: body_model,  # type: ignore[valid-type]  # a class made at run time, as intended
        inference: Annotated[InferenceService, Depends(inference_service)],
        request: Request,
    ) -> InferenceOut:
        return await inference.infer_for(body, request.is_disconnected)

    return router
