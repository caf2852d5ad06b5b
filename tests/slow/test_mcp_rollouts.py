"""rl_get_rollouts through the `mcp` SDK's own client against a live server holding a run's
recorded episodes: its schema, a page with the steps' record, the cursor, and bad arguments as
tool errors in the REST API's words."""

from __future__ import annotations

from pathlib import Path

from core.db import make_engine
from tests.support.live_server import LiveServer
from tests.support.mcp_client import call, http_session, run_async
from tests.support.rollouts import RUN, seed_run, two_steps


def test_an_agent_reads_a_steps_episodes(tmp_path: Path) -> None:
    with LiveServer(tmp_path / "var") as live:
        engine = make_engine(f"sqlite:///{live.var_dir / 'rlcs.db'}")
        seed_run(engine, RUN, two_steps())
        engine.dispose()

        async def body() -> None:
            async with http_session(live.url) as session:
                tools = {t.name: t for t in (await session.list_tools()).tools}
                tool = tools["rl_get_rollouts"]
                assert tool.annotations is not None and tool.annotations.readOnlyHint
                assert {"run_id", "step", "min_reward", "cursor"} <= set(
                    tool.inputSchema["properties"]
                )
                page = await call(session, "rl_get_rollouts", run_id=RUN, step=1, limit=3)
                data = page.data
                assert [i["index"] for i in data["items"]] == [0, 1, 2]
                assert data["items"][1]["reward"] == 1.0 and data["items"][1]["completion"]
                assert [(s["step"], s["sampled"], s["reward_mean"]) for s in data["steps"]] == [
                    (1, 8, 0.5)
                ]
                assert "step 1 group 0 #1: reward 1, advantage 0.5" in page.text
                assert data["next_cursor"] in page.text
                rest = await call(
                    session, "rl_get_rollouts", run_id=RUN, step=1, cursor=data["next_cursor"]
                )
                assert [i["index"] for i in rest.data["items"]] == [3, 4, 5, 6, 7]
                bad = await call(session, "rl_get_rollouts", run_id=RUN, step=-1)
                assert bad.error.startswith("step:")
                unknown = await call(session, "rl_get_rollouts", run_id="r-12345678")
                assert "No run 'r-12345678'" in unknown.error
                empty = await call(
                    session, "rl_get_rollouts", run_id=RUN, min_reward=2, max_reward=1
                )
                assert empty.error.startswith("min_reward:")

        run_async(body)
