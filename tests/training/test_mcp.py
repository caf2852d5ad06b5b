"""The MCP endpoint: an agent's whole path on the tiny model."""

from __future__ import annotations

from pathlib import Path

import httpx
from pydantic import AnyUrl

from tests.support.helpers import TINY_RUN
from tests.support.live_server import LiveServer
from tests.support.mcp_client import call, http_session, run_async
from tests.test_mcp import assert_png


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
