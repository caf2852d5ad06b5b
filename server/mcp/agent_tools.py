"""Tools beyond the reference client: wait on a run or a sweep (with progress notifications),
start and read sweeps, fork a run; each over the service the REST route calls."""

from __future__ import annotations

import asyncio
from typing import Any

from core.models import FINISHED, RunStatus
from server.mcp.models import ForkRunIn, SweepRef, WaitRunIn, WaitSweepIn
from server.mcp.progress import Probe
from server.mcp.registry import Call, ToolSpec
from server.mcp.texts import run_line
from server.runs.schemas import RunForkedOut, RunWaitOut
from server.runs.wait import parse_until, wait_for_run
from server.sweeps.schemas import SweepCreatedOut, SweepCreateIn, SweepDetailOut, SweepWaitOut
from server.sweeps.wait import wait_for_sweep


def _run_probe(call: Call, run_id: str) -> Probe:
    """News about the run: its step (when it rose) and latest mean reward."""
    said = -1

    async def probe() -> tuple[float, float | None, str] | None:
        nonlocal said
        run = await asyncio.to_thread(call.svc.runs.row, run_id)
        if run.step <= said:
            return None
        said = run.step
        rewards = await asyncio.to_thread(call.svc.metrics.latest_rewards, [run_id])
        reward = rewards.get(run_id)
        line = f"{run_id} {run.status.value}: step {run.step}/{run.total_steps}"
        if reward is not None:
            line += f", reward/mean {reward:.4g}"
        return float(run.step), float(run.total_steps), line

    return probe


def _sweep_probe(call: Call, sweep_id: str) -> Probe:
    """News about the sweep: how many of its runs have finished."""
    said = -1

    async def probe() -> tuple[float, float | None, str] | None:
        nonlocal said
        runs = await asyncio.to_thread(call.svc.sweeps.members, sweep_id)
        done = sum(RunStatus(run.status) in FINISHED for run in runs)
        if done <= said:
            return None
        said = done
        return float(done), float(len(runs)), f"{sweep_id}: {done}/{len(runs)} runs finished"

    return probe


async def _wait_run(call: Call, args: WaitRunIn) -> RunWaitOut:
    parse_until(args.until)  # a bad condition is refused before any waiting
    await asyncio.to_thread(call.svc.runs.row, args.run_id)  # so is an unknown run
    wait = wait_for_run(call.svc.runs, args.run_id, args.until, args.timeout_s)
    return await call.progress.during(wait, _run_probe(call, args.run_id))


async def _start_sweep(call: Call, args: SweepCreateIn) -> SweepCreatedOut:
    return await asyncio.to_thread(
        call.svc.sweeps.create,
        args.environment,
        args.base,
        args.grid,
        args.runs,
        args.metric,
        args.goal,
        args.max_runs,
        None,
    )


async def _get_sweep(call: Call, args: SweepRef) -> SweepDetailOut:
    return await asyncio.to_thread(call.svc.sweeps.get, args.sweep_id)


async def _wait_sweep(call: Call, args: WaitSweepIn) -> SweepWaitOut:
    await asyncio.to_thread(call.svc.sweeps.row, args.sweep_id)
    wait = wait_for_sweep(call.svc.sweeps, args.sweep_id, args.timeout_s)
    return await call.progress.during(wait, _sweep_probe(call, args.sweep_id))


async def _fork(call: Call, args: ForkRunIn) -> RunForkedOut:
    return await asyncio.to_thread(
        call.svc.forks.fork, args.run_id, args.overrides(), args.checkpoint_step
    )


def _waited_text(data: dict[str, Any]) -> str:
    if data["condition_met"]:
        return run_line(data) + " Next: rl_get_results(run_id), rl_plot_curves([run_id])."
    return run_line(data) + " Not there yet (timeout): call rl_wait_for_run again."


def _sweep_text(data: dict[str, Any]) -> str:
    best = data.get("best")
    named = ""
    if best:
        named = f" Best so far: {best['run_id']} ({data['metric']}={best['value']:.4g})."
    return (
        f"Sweep {data['sweep_id']}: {data['status']}, {data['runs_finished']}/"
        f"{data['runs_total']} runs finished.{named}"
    )


def agent_tools() -> list[ToolSpec]:
    """The tools beyond the reference client's, listed after them."""
    return [_wait_for_run_tool(), *_sweep_tools(), _fork_run_tool()]


def _wait_for_run_tool() -> ToolSpec:
    """Wait on a run, with progress notifications."""
    return ToolSpec(
        name="rl_wait_for_run",
        description="Wait until a run has finished (until='terminal') or recorded step N "
        "(until='step:N'), or timeout_s passes (default 300, max 600), then answer with "
        "the run as rl_check_status does plus condition_met. Sends progress notifications "
        "(step/total_steps, latest reward/mean) while it waits. This costs nothing on the "
        "server; call it again after a timeout. Cancelling the call stops the waiting, "
        "never the run.",
        args=WaitRunIn,
        run=_wait_run,
        out=RunWaitOut,
        text=_waited_text,
    )


def _sweep_tools() -> list[ToolSpec]:
    """Start a sweep, read it, wait on it."""
    return [
        ToolSpec(
            name="rl_start_sweep",
            description="Queue a grid (every combination of `grid`) or a list (`runs`) of runs "
            "of one environment, each with `base` plus its own overrides; every combination is "
            "validated first (one bad value refuses the whole sweep). Runs go through the "
            "normal queue: minutes to hours. Next: rl_wait_for_sweep(sweep_id, timeout_s), "
            "then rl_get_sweep for results side by side and the best run by `metric`.",
            args=SweepCreateIn,
            run=_start_sweep,
            out=SweepCreatedOut,
            text=lambda d: (
                f"Sweep {d['sweep_id']} queued {len(d['run_ids'])} runs. Next: "
                "rl_wait_for_sweep(sweep_id, timeout_s=300)."
            ),
            read_only=False,
        ),
        ToolSpec(
            name="rl_get_sweep",
            description="A sweep's runs side by side (overrides, status, metrics, the sweep's "
            "metric) and the best run so far. Cheap.",
            args=SweepRef,
            run=_get_sweep,
            out=SweepDetailOut,
            text=_sweep_text,
        ),
        ToolSpec(
            name="rl_wait_for_sweep",
            description="Wait until every run of a sweep has finished, or timeout_s passes "
            "(default 300, max 600), then answer as rl_get_sweep does plus condition_met. "
            "Sends progress notifications (runs finished / runs total).",
            args=WaitSweepIn,
            run=_wait_sweep,
            out=SweepWaitOut,
            text=_sweep_text,
        ),
    ]


def _fork_run_tool() -> ToolSpec:
    """Continue a run's checkpoint as a new run."""
    return ToolSpec(
        name="rl_fork_run",
        description="Queue a new run from a run's state checkpoint (weights and optimizer "
        "state; checkpoint_step, default the newest) with the parent's config plus the "
        "overrides given (e.g. learning_rate, a larger total_steps); its steps continue "
        "from the checkpoint's step. " + "Then rl_wait_for_run(run_id) on the new run.",
        args=ForkRunIn,
        run=_fork,
        out=RunForkedOut,
        text=lambda d: (
            f"Run {d['run_id']} ({d['status']}) forked from "
            f"{d['parent_run_id']} at step {d['parent_step']}. Next: rl_wait_for_run."
        ),
        read_only=False,
    )
