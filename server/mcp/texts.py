"""Short lines a tool result starts with, for hosts that show text rather than JSON."""

from __future__ import annotations

from typing import Any


def run_line(data: dict[str, Any]) -> str:
    reward = data.get("reward_mean")
    said = f", reward/mean {reward:.4g}" if isinstance(reward, int | float) else ""
    why = f" ({data['error']})" if data.get("error") else ""
    steps = f"step {data['step']}/{data['total_steps']}"
    return f"Run {data['run_id']}: {data['status']}{why}, {steps}{said}."
