"""The MCP endpoint, the slow tests: the token, two sessions, a client leaving mid-wait, sweeps,
forks and curves, and the same path through `rlctl mcp` (stdio)."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
from pydantic import AnyUrl

from tests import test_mcp
from tests.support.helpers import start_run
from tests.support.live_server import LiveServer
from tests.support.mcp_client import call, http_session, run_async, stdio_session
from tests.support.rlctl import run_cli
from tests.test_mcp import ACCEPT, INITIALIZE, assert_png, reference_tools

# The fixtures these tests share with tests/test_mcp.py, bound here where pytest looks.
fake = test_mcp.fake


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
