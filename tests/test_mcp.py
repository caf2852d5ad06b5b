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

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient
from matplotlib import image as mpimg
from mcp import types
from pydantic import AnyUrl

from core.settings import PROJECT_ROOT
from server.app import create_app
from tests.support.helpers import TINY_RUN, end_run_leftovers, start_run, wait_for
from tests.support.live_server import LiveServer
from tests.support.mcp_client import call, http_session, run_async, stdio_session
from tests.support.rlctl import run_cli
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


@pytest.mark.training
def test_an_agents_whole_path_on_the_tiny_model(tmp_path: Path) -> None:
    """list, select, edit config to tiny-random, start, wait (progress), results, inference,
    curves, resources; each answer the same JSON as the REST route's."""
    with LiveServer(tmp_path / "var") as live:

        async def body() -> None:
            async with http_session(live.url) as session:
                await agent_path(session, live.api, total_steps=3)

        run_async(body)


async def agent_path(session, api: httpx.Client, total_steps: int) -> None:  # noqa: ANN001
    envs = (await call(session, "rl_list_environments")).data
    assert "repeat_word" in [e["name"] for e in envs["environments"]]
    assert envs["environments"] == api.get("/environments").json()
    selected = (await call(session, "rl_select_environment", name="repeat_word")).data
    assert selected["selected"] == "repeat_word"
    for field, value in {**TINY_RUN, "total_steps": total_steps}.items():
        edited = await call(session, "rl_edit_config", field=field, value=value)
        assert edited.data["configurable_fields"][field] == value
    config = (await call(session, "rl_get_current_config")).data
    assert config == api.get("/config").json()
    started = (await call(session, "rl_start_training", wandb_project="mcp-test")).data
    run_id = started["run_id"]
    assert started["status"] == "queued"
    waited = await call(session, "rl_wait_for_run", run_id=run_id, timeout_s=300)
    assert waited.data["condition_met"] is True, waited.text
    assert waited.data["status"] == "succeeded", waited.text
    assert waited.data["config"]["lora_rank"] == TINY_RUN["lora_rank"]  # the config, not 32
    assert waited.data["config"]["wandb_project"] == "mcp-test"
    assert waited.progress, "no progress notifications"
    done, total, message = waited.progress[-1]
    assert (done, total) == (total_steps, total_steps) and f"step {total_steps}/" in message
    assert [p[0] for p in waited.progress] == sorted({p[0] for p in waited.progress})
    results = (await call(session, "rl_get_results", run_id=run_id)).data
    assert results == api.get(f"/runs/{run_id}/metrics").json()
    assert results["final"] is True and results["weights_path"]
    status = (await call(session, "rl_check_status", run_id=run_id)).data
    assert status["step"] == total_steps and status["run_id"] == run_id
    listed = (await call(session, "rl_list_runs")).data
    assert run_id in [r["run_id"] for r in listed["runs"]]
    sampled = await call(session, "rl_test_inference", prompts=["Repeat: apple"], max_tokens=4)
    assert sampled.data["model"] == "tiny-random" and len(sampled.data["results"]) == 1
    assert_png(await call(session, "rl_plot_curves", run_ids=[run_id]), rows=2)
    log = await session.read_resource(AnyUrl(f"run://{run_id}/log"))
    assert f"step {total_steps}/{total_steps}" in log.contents[0].text
    metrics = await session.read_resource(AnyUrl(f"run://{run_id}/metrics"))
    assert f'"run_id": "{run_id}"' in metrics.contents[0].text
    health = (await call(session, "rl_health_check")).data
    assert health["status"] == "ok"


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


@pytest.mark.slow
def test_a_token_is_checked_before_any_mcp_handling(tmp_path: Path) -> None:
    initialize, accept = INITIALIZE, ACCEPT
    tokens = {"RLCS_API_TOKEN": "s3cret-token", "RLCS_READ_TOKENS": "reader-token"}
    with LiveServer(tmp_path / "var", **tokens) as live:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = httpx.post(f"{live.url}/mcp", json=initialize, headers=accept | headers)
            assert refused.status_code == 401, refused.text
            assert "RLCS_API_TOKEN" in refused.json()["detail"]
            assert refused.headers["www-authenticate"] == "Bearer"
            assert "mcp-session-id" not in refused.headers

        reader = {"Authorization": "Bearer reader-token"}
        read_only = httpx.post(f"{live.url}/mcp", json=initialize, headers=accept | reader)
        assert read_only.status_code == 403 and "read-only" in read_only.json()["detail"]

        async def body() -> None:
            async with http_session(live.url, token="s3cret-token") as session:
                assert (await call(session, "rl_health_check")).data["status"] == "ok"
            async with stdio_session(live.url, token="s3cret-token") as session:
                assert (await call(session, "rl_health_check")).data["status"] == "ok"

        run_async(body)
        refused = run_cli(live.url, "mcp", timeout=60)  # no token: says so and exits
        assert refused.returncode == 1 and "HTTP 401" in refused.stderr, refused.stderr
        assert "RLCS_API_TOKEN" in refused.stderr and refused.stdout == ""


@pytest.mark.slow
def test_two_sessions_at_once_and_a_client_leaving_mid_wait(fake: LiveServer) -> None:
    """Session A waits on a run while B reads; then a client leaves in the middle of a wait:
    the run is untouched and finishes."""
    long = start_run(fake.api, environment="arithmetic", total_steps=30)
    short = start_run(fake.api, environment="arithmetic", total_steps=5)
    seen: dict[str, object] = {}

    async def waiter() -> None:
        async with http_session(fake.url) as a:
            seen["a"] = await call(a, "rl_wait_for_run", run_id=short, timeout_s=60)

    async def reader() -> None:
        async with http_session(fake.url) as b:
            seen["b"] = (await call(b, "rl_check_status", run_id=short)).data["run_id"]
            seen["b_runs"] = len((await call(b, "rl_list_runs")).data["runs"])

    async def leaver() -> None:
        with anyio.move_on_after(60):
            async with http_session(fake.url) as c, anyio.create_task_group() as tg:
                progressed = anyio.Event()

                async def wait() -> None:
                    async def on_progress(*_: object) -> None:
                        progressed.set()

                    await c.call_tool(
                        "rl_wait_for_run",
                        {"run_id": long, "timeout_s": 600},
                        progress_callback=on_progress,
                    )

                tg.start_soon(wait)
                await progressed.wait()
                tg.cancel_scope.cancel()  # the client goes away mid-wait
        seen["left"] = True

    async def body() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(reader)
            tg.start_soon(leaver)

    run_async(body)
    assert seen["a"].data["status"] == "succeeded" and seen["a"].progress  # type: ignore[attr-defined]
    assert seen["b"] == short and seen["left"] is True
    run = fake.api.get(f"/runs/{long}").json()
    assert run["status"] in ("queued", "starting", "running"), run  # not stopped by it
    ended = fake.api.get(f"/runs/{long}/wait", params={"timeout": 60}).json()
    assert ended["status"] == "succeeded" and ended["step"] == 30


@pytest.mark.slow
def test_sweeps_forks_and_curves_of_several_runs(fake: LiveServer) -> None:
    async def body() -> None:
        async with http_session(fake.url) as session:
            created = await call(
                session,
                "rl_start_sweep",
                environment="arithmetic",
                base={"total_steps": 4},
                grid={"learning_rate": [1e-5, 4e-5]},
            )
            sweep_id = created.data["sweep_id"]
            waited = await call(session, "rl_wait_for_sweep", sweep_id=sweep_id, timeout_s=60)
            assert waited.data["condition_met"] is True and waited.data["runs_finished"] == 2
            assert waited.progress and waited.progress[-1][:2] == (2, 2)
            got = (await call(session, "rl_get_sweep", sweep_id=sweep_id)).data
            assert got == fake.api.get(f"/sweeps/{sweep_id}").json()
            run_ids = created.data["run_ids"]
            curves = await call(session, "rl_plot_curves", run_ids=run_ids)
            assert_png(curves, rows=2)
            assert set(curves.data["points"]) == set(run_ids)

    run_async(body)


@pytest.mark.slow
def test_stdio_entry_point_runs_the_same_path(fake: LiveServer) -> None:
    """`python -m cli mcp` proxies to the server: the same tools, progress and results."""

    async def body() -> None:
        async with stdio_session(fake.url) as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert set(reference_tools()) <= names
            await agent_path_light(session, fake.api)

    run_async(body)


async def agent_path_light(session, api: httpx.Client) -> None:  # noqa: ANN001
    """The agent path on the fake runner (the training itself is tested above)."""
    await call(session, "rl_select_environment", name="repeat_word")
    await call(session, "rl_edit_config", field="model_name", value="tiny-random")
    run_id = (await call(session, "rl_start_training", total_steps=8)).data["run_id"]
    waited = await call(session, "rl_wait_for_run", run_id=run_id, timeout_s=60)
    assert waited.data["status"] == "succeeded" and waited.progress
    assert waited.progress[-1][:2] == (8, 8)
    results = (await call(session, "rl_get_results", run_id=run_id)).data
    assert results == api.get(f"/runs/{run_id}/metrics").json()
    sampled = await call(session, "rl_test_inference", prompts=["Repeat: pear"], max_tokens=2)
    assert sampled.data["model"] == "tiny-random"
    bad = await call(session, "rl_check_status", run_id="r-00000000")
    assert bad.error == api.get("/runs/r-00000000").json()["detail"]
    log = await session.read_resource(AnyUrl(f"run://{run_id}/log"))
    assert "fake runner" in log.contents[0].text


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
