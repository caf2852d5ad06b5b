"""rl_get_rollouts: what a run's model said at a step (its recorded episodes, a page at a time,
filtered as GET /runs/{id}/rollouts filters them) and the record of the steps on the page."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from core.models import RUN_ID
from core.rollout_store import Filters
from server.mcp.registry import Call, ToolSpec
from server.runs.rollout_schemas import RolloutPageOut, RolloutStepOut
from server.schemas import Request

PREVIEW = 120  # characters of a completion in the tool's text


class RolloutsIn(Request):
    run_id: str = Field(pattern=RUN_ID.pattern, description="A run id such as r-3f9c2a1b")
    step: int | None = Field(None, ge=0, le=1_000_000_000, description="Only this step")
    group: int | None = Field(None, ge=0, le=1_000_000_000, description="Only this group")
    min_reward: float | None = Field(None, description="Only rewards at least this")
    max_reward: float | None = Field(None, description="Only rewards at most this")
    prompt_key: str | None = Field(
        None, pattern=r"^[0-9a-f]{16}$", description="Only this prompt, across steps"
    )
    limit: int = Field(20, ge=1, le=1000, description="Episodes per page")
    cursor: str | None = Field(
        None, max_length=40, description="The next_cursor of the page before"
    )


class RolloutsToolOut(RolloutPageOut):
    steps: list[RolloutStepOut] = Field(
        description="The record of each step on the page: episodes sampled and kept, rewards"
    )


async def _rollouts(call: Call, args: RolloutsIn) -> RolloutsToolOut:
    filters = Filters(args.step, args.group, args.min_reward, args.max_reward, args.prompt_key)
    rollouts = call.svc.rollouts
    page, steps = await asyncio.to_thread(
        lambda: (
            rollouts.page(args.run_id, filters, args.limit, args.cursor),
            rollouts.steps(args.run_id),
        )
    )
    shown = {item.step for item in page.items}
    return RolloutsToolOut(**page.model_dump(), steps=[s for s in steps.steps if s.step in shown])


def _text(data: dict[str, Any]) -> str:
    items = data["items"]
    if not items:
        return f"Run {data['run_id']}: no recorded episodes match."
    lines = [f"{len(items)} episodes of run {data['run_id']}:"]
    for item in items:
        completion = item["completion"].replace("\n", " | ")
        lines.append(
            f"- step {item['step']} group {item['group']} #{item['index']}: reward "
            f"{_num(item['reward'])}, advantage {_num(item['advantage'])}, "
            f"{item['finish_reason'] or '?'}: {completion[:PREVIEW]!r}"
        )
    if data["next_cursor"]:
        lines.append(f"More: call again with cursor={data['next_cursor']!r}.")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def rollouts_tool() -> ToolSpec:
    return ToolSpec(
        name="rl_get_rollouts",
        description="What the model said during a run: its recorded episodes (prompt, "
        "completion, reward, advantage, finish reason, the environment's and the model's text "
        "apart), filtered by step, group, reward range or prompt, a page at a time, with each "
        "step's record (episodes sampled and kept, mean/min/max reward). Cheap. Use it to see "
        "whether the reward is hacked, the format broke, or what changed between two steps.",
        args=RolloutsIn,
        run=_rollouts,
        out=RolloutsToolOut,
        text=_text,
    )
