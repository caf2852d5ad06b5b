"""The MCP server (the SDK's low-level `Server`): tool list and calls, resources. Arguments are
validated by the tools' pydantic models, so a bad one gets the REST API's words as a tool error
(isError), as does any error a service raises; nothing is changed by a refused call."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.helper_types import ReadResourceContents
from pydantic import AnyUrl, ValidationError
from sqlalchemy.exc import OperationalError

from server import __version__
from server.container import Services
from server.errors import DomainError
from server.guards.validation import validation_detail
from server.mcp import resources
from server.mcp.agent_tools import agent_tools
from server.mcp.curves import curve_tool
from server.mcp.progress import Progress
from server.mcp.registry import Call, ToolSpec, error_result
from server.mcp.rollouts_tool import rollouts_tool
from server.mcp.tools import reference_tools

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Train language models with RL (LoRA) on this server's environments. Usual path: "
    "rl_list_environments -> rl_select_environment -> rl_get_current_config / rl_edit_config "
    "-> rl_test_inference (a quick check of model and verifier) -> rl_start_training -> "
    "rl_wait_for_run (answers when the run ends or at its timeout, with progress) -> "
    "rl_get_results and rl_plot_curves; rl_get_rollouts shows what the model said. Runs take "
    "minutes to hours: wait, do not poll. "
    "rl_start_sweep tries several settings at once; rl_fork_run continues a run with new "
    "settings from its checkpoint. Resources run://<run_id>/log and run://<run_id>/metrics."
)


def all_tools(svc: Services) -> list[ToolSpec]:
    return [*reference_tools(svc.settings), *agent_tools(), curve_tool(), rollouts_tool()]


def build_server(svc: Services) -> Server[Any, Any]:
    specs = {spec.name: spec for spec in all_tools(svc)}
    listing = [spec.tool() for spec in specs.values()]  # schemas built once
    server: Server[Any, Any] = Server(
        "rl-control-server", version=__version__, instructions=INSTRUCTIONS
    )

    # mcp 1.x's low-level Server decorators carry no annotations (hence the ignores below);
    # each handler is annotated, and checked, itself.
    @server.list_tools()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        return listing

    # Our models validate (validate_input=False): their messages are the REST API's.
    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        spec = specs.get(name)
        if spec is None:
            return error_result(f"name: no tool '{name[:80]}'; tools/list names the tools.")
        try:
            args = spec.args.model_validate(arguments)
        except ValidationError as exc:
            return error_result(validation_detail(exc.errors()))
        return await _run(spec, Call(svc, Progress(server.request_context)), args)

    @server.list_resources()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_resources() -> list[types.Resource]:
        return await asyncio.to_thread(resources.listed, svc)

    @server.list_resource_templates()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_templates() -> list[types.ResourceTemplate]:
        return resources.TEMPLATES

    @server.read_resource()  # type: ignore[no-untyped-call, untyped-decorator]
    async def read_resource(uri: AnyUrl) -> list[ReadResourceContents]:
        return await resources.read(svc, uri)

    return server


async def _run(spec: ToolSpec, call: Call, args: Any) -> types.CallToolResult:
    try:
        return spec.result(await spec.run(call, args))
    except DomainError as exc:
        return error_result(exc.detail)
    except OperationalError:
        return error_result("The database is busy (another writer holds its lock). Retry soon.")
    except Exception:  # a bug: logged here, and the session goes on
        log.exception("MCP tool %s failed", spec.name)
        return error_result(f"{spec.name} failed on the server (see its log); this is a bug.")
