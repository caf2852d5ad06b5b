"""What a run spent (issue 36): device seconds, CPU seconds and tokens (prefill, sampled,
trained), charged to the run's totals with each step it records; money is the server's, on
read (server/runs/pricing.py). The user's side: docs/runs.md, "What a run cost"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from core.models import Run

# The run's totals after each step, in that step's metric row (cumulative, like the run's).
DEVICE_S = "cost/device_s"
CPU_S = "cost/cpu_s"
TOKENS_PREFILL = "cost/tokens_prefill"
TOKENS_SAMPLED = "cost/tokens_sampled"
TOKENS_TRAINED = "cost/tokens_trained"

# A Tinker API session's step metrics count what its optimizer step trained and what was
# sampled since the previous one (server/tinker_api's tally).
SESSION_TRAINED = "train/tokens"
SESSION_SAMPLED = "sampler/tokens"

# Where the device seconds were spent (Run.cost_device): the local engine's torch device
# ("cpu", "cuda", "cuda:1"), or TINKER_HOSTED: the runner's wall seconds while hosted Tinker
# did the work, which Tinker bills by the token.
TINKER_HOSTED = "tinker"

N = TypeVar("N", int, float)


@dataclass(frozen=True)
class Spent:
    """What was spent since the last charge; None: not measured (a Tinker API session's
    device time, its prompts' prefill)."""

    device_s: float | None = None
    cpu_s: float | None = None
    tokens_prefill: int | None = None
    tokens_sampled: int | None = None
    tokens_trained: int | None = None
    device: str | None = None


def charge(run: Run, spent: Spent) -> dict[str, float]:
    """Add `spent` to the run's totals (the caller's transaction writes them); the totals
    as metrics. A total stays None until something of its kind is measured."""
    run.cost_device_s = _add(run.cost_device_s, spent.device_s)
    run.cost_cpu_s = _add(run.cost_cpu_s, spent.cpu_s)
    run.cost_tokens_prefill = _add(run.cost_tokens_prefill, spent.tokens_prefill)
    run.cost_tokens_sampled = _add(run.cost_tokens_sampled, spent.tokens_sampled)
    run.cost_tokens_trained = _add(run.cost_tokens_trained, spent.tokens_trained)
    if spent.device is not None:
        run.cost_device = spent.device
    totals = {
        DEVICE_S: run.cost_device_s,
        CPU_S: run.cost_cpu_s,
        TOKENS_PREFILL: run.cost_tokens_prefill,
        TOKENS_SAMPLED: run.cost_tokens_sampled,
        TOKENS_TRAINED: run.cost_tokens_trained,
    }
    return {key: float(value) for key, value in totals.items() if value is not None}


def session_spent(metrics: dict[str, Any]) -> Spent:
    """A Tinker API session's step, from the tokens its metrics count (its device time and
    prompts are not measured: its models share the server's engine)."""
    return Spent(
        tokens_sampled=_count(metrics.get(SESSION_SAMPLED)),
        tokens_trained=_count(metrics.get(SESSION_TRAINED)),
    )


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value >= 0 else None


def _add(total: N | None, more: N | None) -> N | None:
    if more is None:
        return total
    return more if total is None else total + more
