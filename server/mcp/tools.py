"""The reference client's eleven tools, same names and arguments, answered by the services the
REST routes they stand for call (GET /environments, POST /runs, ...)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from core.settings import Settings
from server.environments.schemas import ConfigEditIn, ConfigOut, SelectOut
from server.health.report import health_report
from server.health.schemas import HealthOut
from server.inference.schemas import InferenceIn, InferenceOut, inference_in
from server.mcp.models import (
    EnvironmentsOut,
    ListRunsIn,
    NoArgs,
    RunRef,
    RunsOut,
    SelectIn,
    StartTrainingIn,
)
from server.mcp.registry import Call, ToolSpec
from server.mcp.texts import run_line
from server.runs.schemas import RunCreatedOut, RunDetailOut, RunResultsOut

WAIT_HINT = (
    "A run takes minutes to hours: call rl_wait_for_run(run_id, timeout_s=300), which answers "
    "as soon as it finishes (with progress notifications), instead of polling rl_check_status."
)


async def _environments(call: Call, _args: NoArgs) -> EnvironmentsOut:
    found = await asyncio.to_thread(call.svc.catalog.listing)
    return EnvironmentsOut(environments=found, count=len(found))


async def _select(call: Call, args: SelectIn) -> SelectOut:
    return await asyncio.to_thread(call.svc.configs.select, args.name)


async def _config(call: Call, _args: NoArgs) -> ConfigOut:
    configs = call.svc.configs
    return await asyncio.to_thread(lambda: configs.view(configs.selected()))


async def _edit(call: Call, args: ConfigEditIn) -> ConfigOut:
    configs = call.svc.configs
    return await asyncio.to_thread(
        lambda: configs.set_fields(configs.selected(), {args.field: args.value})
    )


async def _start(call: Call, args: StartTrainingIn) -> RunCreatedOut:
    return await asyncio.to_thread(call.svc.runs.create, args.environment, args.overrides(), None)


async def _status(call: Call, args: RunRef) -> RunDetailOut:
    return await asyncio.to_thread(call.svc.runs.get, args.run_id)


async def _stop(call: Call, args: RunRef) -> RunCreatedOut:
    return await asyncio.to_thread(call.svc.runs.stop, args.run_id)


async def _results(call: Call, args: RunRef) -> RunResultsOut:
    return await asyncio.to_thread(call.svc.runs.results, args.run_id)


async def _runs(call: Call, args: ListRunsIn) -> RunsOut:
    runs = await asyncio.to_thread(call.svc.runs.list, args.status, args.environment, args.limit, 0)
    return RunsOut(runs=runs)


async def _infer(call: Call, args: InferenceIn) -> InferenceOut:
    abandoned = threading.Event()
    try:
        return await asyncio.to_thread(call.svc.inference.infer, args, abandoned)
    except asyncio.CancelledError:
        abandoned.set()  # a cancelled call: the worker stops decoding at its next step
        raise


async def _health(call: Call, _args: NoArgs) -> HealthOut:
    return await asyncio.to_thread(health_report, call.svc)


def _env_text(data: dict[str, Any]) -> str:
    names = ", ".join(e["name"] for e in data["environments"])
    return f"{data['count']} environments: {names}. Next: rl_select_environment(name)."


def _config_text(data: dict[str, Any]) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in data["configurable_fields"].items())
    return f"Config of {data['environment']} (version {data['version']}): {fields}."


def _results_text(data: dict[str, Any]) -> str:
    shown = ", ".join(f"{k}={v:.4g}" for k, v in data["metrics"].items() if isinstance(v, float))
    final = "final" if data["final"] else "so far (the run has not finished)"
    return (
        f"Run {data['run_id']} ({data['status']}, step {data['step']}/{data['total_steps']}), "
        f"metrics {final}: {shown or 'none yet'}; weights: {data['weights_path']}."
    )


def _infer_text(data: dict[str, Any]) -> str:
    summary = ", ".join(f"{k}={v}" for k, v in data["summary"].items())
    where = f"{data['model']} on {data['environment']}"
    return f"{len(data['results'])} samples from {where}: {summary}."


def reference_tools(settings: Settings) -> list[ToolSpec]:
    """The eleven tools, in the order the reference client lists them."""
    return [
        *_environment_tools(),
        *_config_tools(),
        *_training_tools(),
        *_result_tools(),
        *_probe_tools(settings),
    ]


def _environment_tools() -> list[ToolSpec]:
    """Find the environments and pick the one the other tools use."""
    return [
        ToolSpec(
            name="rl_list_environments",
            description="List the RL environments the server discovered: name, class, file "
            "path, description. Cheap. Next: rl_select_environment(name); read file_path with "
            "file tools to see how an environment loads data and scores answers.",
            args=NoArgs,
            run=_environments,
            out=EnvironmentsOut,
            text=_env_text,
        ),
        ToolSpec(
            name="rl_select_environment",
            description="Select the environment that rl_get_current_config, rl_edit_config, "
            "rl_start_training and rl_test_inference use, and return its config. Cheap. Next: "
            "rl_get_current_config / rl_edit_config, then rl_test_inference before training.",
            args=SelectIn,
            run=_select,
            out=SelectOut,
            text=lambda d: (
                f"Selected {d['selected']} ({d['file_path']}). Next: "
                "rl_get_current_config, rl_edit_config(field, value), rl_test_inference."
            ),
            read_only=False,
        ),
    ]


def _config_tools() -> list[ToolSpec]:
    """Read and edit the selected environment's config."""
    return [
        ToolSpec(
            name="rl_get_current_config",
            description="The selected environment's config: the fields you may change "
            "(configurable_fields, with their JSON schema) and those fixed by the server "
            "(locked_fields). Cheap. Next: rl_edit_config(field, value).",
            args=NoArgs,
            run=_config,
            out=ConfigOut,
            text=_config_text,
        ),
        ToolSpec(
            name="rl_edit_config",
            description="Set one config field of the selected environment (validated; a locked "
            "or unknown field is refused with the reason and nothing changes). Cheap. Runs "
            "started afterwards use it; running ones keep their frozen config.",
            args=ConfigEditIn,
            run=_edit,
            out=ConfigOut,
            text=_config_text,
            read_only=False,
        ),
    ]


def _training_tools() -> list[ToolSpec]:
    """Start a run, look at it, stop it."""
    return [
        ToolSpec(
            name="rl_start_training",
            description="Queue a LoRA training run of the selected (or given) environment "
            "with its config; wandb_project, lora_rank, learning_rate and any other config "
            "field given here override it for this run only. Returns at once with the run_id. "
            + WAIT_HINT
            + " Validate first with rl_test_inference and a small total_steps.",
            args=StartTrainingIn,
            run=_start,
            out=RunCreatedOut,
            text=lambda d: f"Run {d['run_id']} is {d['status']}. " + WAIT_HINT,
            read_only=False,
        ),
        ToolSpec(
            name="rl_check_status",
            description="A run's status, step, latest metrics, error and progress, now (no "
            "rate limit, one database read). To wait for a run, call rl_wait_for_run instead "
            "of calling this repeatedly.",
            args=RunRef,
            run=_status,
            out=RunDetailOut,
            text=run_line,
        ),
        ToolSpec(
            name="rl_stop_training",
            description="Stop a run (it saves a checkpoint, so rl_fork_run and resume can "
            "continue from it). Idempotent. Use it when metrics look bad or to free the slot.",
            args=RunRef,
            run=_stop,
            out=RunCreatedOut,
            text=lambda d: f"Run {d['run_id']} is {d['status']}.",
            read_only=False,
            destructive=True,
        ),
    ]


def _result_tools() -> list[ToolSpec]:
    """A run's results, and the list of runs."""
    return [
        ToolSpec(
            name="rl_get_results",
            description="A run's final (or, while it runs, latest) metrics, the last rows of "
            "its history, its checkpoints and where its weights are. Cheap. Next: "
            "rl_plot_curves([run_id]) to see the curves, rl_test_inference(run_id=...) to "
            "sample the trained adapter, rl_fork_run to continue with other settings.",
            args=RunRef,
            run=_results,
            out=RunResultsOut,
            text=_results_text,
        ),
        ToolSpec(
            name="rl_list_runs",
            description="Runs, newest first, with status, step and latest mean reward. Cheap.",
            args=ListRunsIn,
            run=_runs,
            out=RunsOut,
            text=lambda d: (
                f"{len(d['runs'])} runs: "
                + ", ".join(f"{r['run_id']} {r['status']}" for r in d["runs"][:20])
            ),
        ),
    ]


def _probe_tools(settings: Settings) -> list[ToolSpec]:
    """Sample a model without training; is the server up."""
    return [
        ToolSpec(
            name="rl_test_inference",
            description="Sample the selected environment's model (or a run's trained adapter "
            "with run_id) on prompts, or on num_items tasks drawn from the environment, and "
            "score each answer with its verifier, without training. Seconds to a few minutes "
            "(the first call loads the model). Do this before a long run.",
            args=inference_in(settings.inference_max_prompts),
            run=_infer,
            out=InferenceOut,
            text=_infer_text,
            read_only=False,
        ),
        ToolSpec(
            name="rl_health_check",
            description="Is the server up: version, backend, environment count, active runs, "
            "launcher. Cheap.",
            args=NoArgs,
            run=_health,
            out=HealthOut,
            text=lambda d: (
                f"Server {d['status']} (version {d['version']}, backend {d['backend']}, "
                f"{d['environments']} environments, {d['active_runs']} active runs)."
            ),
        ),
    ]
