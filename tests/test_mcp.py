"""The MCP endpoint, through the `mcp` SDK's own client over streamable HTTP against a live
server: the reference client's tools with schemas, an agent's whole path on tiny-random, bad
input as tool errors in the REST API's words, the token, two sessions, a client leaving
mid-wait, the curve PNG, and the same path through `rlctl mcp` (stdio)."""

from __future__ import annotations

import ast
import base64
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from matplotlib import image as mpimg
from mcp import types

from core.settings import PROJECT_ROOT
from server.app import create_app
from tests.support.helpers import end_run_leftovers, start_run, wait_for
from tests.support.live_server import LiveServer
from tests.support.mcp_client import call, http_session, run_async
from tests.support.settings import make_settings

FAKE = "tests.support.fake_runners.runner"
REFERENCE = PROJECT_ROOT / "tests" / "support" / "reference_client" / "rl_training_tool.py"
OURS = {"rl_wait_for_run", "rl_start_sweep", "rl_get_sweep", "rl_wait_for_sweep", "rl_fork_run"}


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    var_dir = tmp_path_factory.mktemp("mcp-fake") / "var"
    with LiveServer(
        var_dir,
        RLCS_RUNNER_MODULE=FAKE,
        FAKE_RUNNER_STEP_S="0.1",
        FAKE_RUNNER_MODE="steps",
        RLCS_MAX_CONCURRENT_RUNS="4",
        RLCS_STOP_GRACE_S="3",
    ) as live:
        yield live
    end_run_leftovers(var_dir)  # the `sleep` each fake run leaves on purpose


def reference_tools() -> dict[str, list[str]]:
    """The reference client's tools and their argument names, read from its source."""
    tree = ast.parse(REFERENCE.read_text())
    return {
        node.name: [a.arg for a in node.args.args]
        for node in tree.body
        if isinstance(node, ast.AsyncFunctionDef) and node.name.startswith("rl_")
    }


def test_the_tools_are_the_reference_clients_with_schemas(fake: LiveServer) -> None:
    async def body() -> list[types.Tool]:
        async with http_session(fake.url) as session:
            return (await session.list_tools()).tools

    tools = {tool.name: tool for tool in run_async(body)}
    reference = reference_tools()
    assert len(reference) == 11 and set(reference) <= set(tools)
    assert OURS | {"rl_plot_curves"} <= set(tools)
    for name, args in reference.items():
        schema = tools[name].inputSchema
        assert schema["type"] == "object" and set(args) <= set(schema.get("properties", {}))
        assert tools[name].description and tools[name].outputSchema is not None
    assert tools["rl_edit_config"].inputSchema["required"] == ["field", "value"]
    assert set(tools["rl_wait_for_run"].inputSchema["required"]) == {"run_id"}
    assert "rl_wait_for_run" in tools["rl_start_training"].description  # what to do next
    assert tools["rl_stop_training"].annotations.destructiveHint is True


def assert_png(called, rows: int) -> None:  # noqa: ANN001
    images = [c for c in called.result.content if isinstance(c, types.ImageContent)]
    assert len(images) == 1 and images[0].mimeType == "image/png", called.text
    png = base64.b64decode(images[0].data)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    pixels = mpimg.imread(io.BytesIO(png), format="png")
    assert pixels.shape[0] > 100 * rows and pixels.shape[1] > 300
    assert all(n > 0 for by_metric in called.data["points"].values() for n in by_metric.values())


def test_bad_input_is_a_tool_error_in_the_rest_words_and_changes_nothing(
    fake: LiveServer,
) -> None:
    api = fake.api
    api.post("/environments/arithmetic/select")
    done = start_run(api, environment="arithmetic", total_steps=1)
    wait_for(lambda: api.get(f"/runs/{done}").json()["status"] == "succeeded", 30)
    before = (api.get("/runs").json(), api.get("/config").json())
    # Tool, arguments, and the REST route for the same thing (with the arguments as its body
    # when it takes one).
    sweep = {"environment": "arithmetic", "grid": {"seed": [0, 1, 2]}, "max_runs": 2}
    cases = [
        ("rl_select_environment", {"name": "no-such-env"}, "POST /environments/no-such-env/select"),
        ("rl_select_environment", {"name": "bad name"}, "POST /environments/bad%20name/select"),
        ("rl_edit_config", {"field": "tokenizer_name", "value": "gpt2"}, "POST /config"),
        ("rl_edit_config", {"field": "group_size", "value": "many"}, "POST /config"),
        ("rl_edit_config", {"field": "group_size"}, "POST /config"),
        ("rl_edit_config", {"field": "no_such", "value": 1}, "POST /config"),
        ("rl_check_status", {"run_id": "r-00000000"}, "GET /runs/r-00000000"),
        ("rl_get_results", {"run_id": "r-00000000"}, "GET /runs/r-00000000/metrics"),
        ("rl_stop_training", {"run_id": "bogus"}, "POST /runs/bogus/stop"),
        ("rl_start_training", {"environment": "nope"}, "POST /runs"),
        ("rl_start_training", {"lora_rank": 0}, "POST /runs"),
        ("rl_test_inference", {"prompts": []}, "POST /test/inference"),
        ("rl_wait_for_run", {"run_id": done, "until": "done"}, f"GET /runs/{done}/wait?until=done"),
        ("rl_fork_run", {"run_id": done}, f"POST /runs/{done}/fork"),
        ("rl_get_sweep", {"sweep_id": "s-00000000"}, "GET /sweeps/s-00000000"),
        # More runs than the sweep allows: the one queue limit there is (runs queue unbounded).
        ("rl_start_sweep", sweep, "POST /sweeps"),
    ]
    with_body = {"/config", "/runs", "/test/inference", "/sweeps"}

    async def body() -> list[tuple[str, str]]:
        async with http_session(fake.url) as session:
            said = [(await call(session, name, **args)).error for name, args, _ in cases]
            unknown = (await call(session, "rl_no_such_tool")).error
            extra = (await call(session, "rl_list_environments", foo=1)).error
            assert "rl_no_such_tool" in unknown and extra.startswith("foo: unknown field")
            assert (await call(session, "rl_health_check")).data["status"] == "ok"  # same session
            return said

    said = run_async(body)
    for (name, args, route), text in zip(cases, said, strict=True):
        method, path = route.split(" ")
        rest = api.request(method, path, json=args if path in with_body else None)
        assert 400 <= rest.status_code < 500, (name, rest.text)
        assert text == rest.json()["detail"], (name, text, rest.text)
    assert (api.get("/runs").json(), api.get("/config").json()) == before


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def test_the_guards_of_every_route_cover_mcp(tmp_path: Path) -> None:
    """Host allowlist, cross-site refusal, JSON bodies and the loopback rule answer before
    MCP does; apps made one after another in one process each run their own MCP sessions."""
    settings = make_settings(tmp_path, allowed_hosts=[])
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8080") as local:
        served = local.post("/mcp", json=INITIALIZE, headers=ACCEPT)
        assert served.status_code == 200 and served.headers["mcp-session-id"]
        refusals = [
            (400, {"Host": "evil.example"}, "DNS rebinding"),
            (403, {"Origin": "http://evil.example"}, "Cross-site request refused"),
            (415, {"Content-Type": "text/plain"}, "must be JSON"),
        ]
        for status, headers, words in refusals:
            sent = {"Content-Type": "application/json"} | ACCEPT | headers
            resp = local.post("/mcp", content=json.dumps(INITIALIZE), headers=sent)
            assert resp.status_code == status and words in resp.json()["detail"], resp.text
            assert "mcp-session-id" not in resp.headers
    with TestClient(create_app(settings), client=("203.0.113.7", 50000)) as remote:
        resp = remote.post("/mcp", json=INITIALIZE, headers=ACCEPT)
        assert resp.status_code == 403 and "RLCS_API_TOKEN" in resp.json()["detail"]


def test_rlctl_mcp_stays_light() -> None:
    """The other commands never load the SDK; `rlctl mcp` loads it but no server library."""
    script = (
        "import sys, cli.main\n"
        "light = 'mcp' not in sys.modules\n"
        "import cli.mcp_proxy\n"
        "heavy = {'fastapi', 'sqlmodel', 'sqlalchemy', 'torch'} & set(sys.modules)\n"
        "print(light, sorted(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True
    )
    assert out.stdout.strip() == "True []", out.stderr
