"""What a run's steps sampled: pages of its recorded episodes, and each step's record."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from core.models import RUN_ID
from core.rollout_store import Filters
from server.runs.deps import rollout_service
from server.runs.rollout_schemas import RolloutPageOut, RolloutStepsOut
from server.runs.rollouts import RolloutService

router = APIRouter(tags=["runs"])
Rollouts = Annotated[RolloutService, Depends(rollout_service)]
RunId = Annotated[str, Path(pattern=RUN_ID.pattern, description="A run id such as r-3f9c2a1b")]
MAX_PAGE = 1000


@router.get("/runs/{run_id}/rollouts")
def run_rollouts(
    run_id: RunId,
    rollouts: Rollouts,
    step: Annotated[int | None, Query(ge=0, le=1_000_000_000, description="Only this step")] = None,
    group: Annotated[
        int | None, Query(ge=0, le=1_000_000_000, description="Only this group of the step")
    ] = None,
    min_reward: Annotated[float | None, Query(description="Only rewards at least this")] = None,
    max_reward: Annotated[float | None, Query(description="Only rewards at most this")] = None,
    prompt_key: Annotated[
        str | None,
        Query(pattern=r"^[0-9a-f]{16}$", description="Only this prompt (an item's prompt_key)"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Items per page")] = 100,
    cursor: Annotated[
        str | None, Query(max_length=40, description="The next_cursor of the page before")
    ] = None,
) -> RolloutPageOut:
    """The episodes the run recorded, in step order, a page at a time: each with its prompt,
    completion, reward, advantage and the environment's and the model's text apart."""
    filters = Filters(step, group, min_reward, max_reward, prompt_key)
    return rollouts.page(run_id, filters, limit, cursor)


@router.get("/runs/{run_id}/rollouts/steps")
def run_rollout_steps(run_id: RunId, rollouts: Rollouts) -> RolloutStepsOut:
    """Each recorded step: episodes sampled and kept, their rewards, what the cap thinned."""
    return rollouts.steps(run_id)
