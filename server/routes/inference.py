"""POST /test/inference: sample a model (or a run's adapter) on prompts and score them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from server.deps import Services, services
from server.schemas import InferenceIn, InferenceOut

router = APIRouter(tags=["inference"])


@router.post("/test/inference", response_model=InferenceOut)
def test_inference(
    body: InferenceIn, svc: Annotated[Services, Depends(services)]
) -> dict[str, Any]:
    return svc.inference.infer(body)
