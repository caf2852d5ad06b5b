"""The run page's Rollouts view in a real browser against a live server: a real tiny-random run's
episodes (step slider, reward filter, best and worst, a group side by side, the model's tokens
apart from the environment's text); a run whose episodes hold `<script>` and `<img onerror>`
showing them as text, never running them; a step of 1,000 episodes; one prompt across steps.

Like test_dashboard.py: the page's DOM contract only, the REST API and the database (as a runner
writes it) set up state, and the page is waited on through Playwright's `expect`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from core.db import make_engine
from core.rollouts import RolloutRecord, Segment
from tests.browser.conftest import screenshot
from tests.browser.test_dashboard import RUN_START_S, open_route
from tests.support.helpers import TINY_RUN, finish_run, start_run
from tests.support.live_server import LiveServer
from tests.support.rollouts import episode, seed_run

expect = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed (the dev extra)"
).expect

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.timeout(600)

HOSTILE_RUN = "r-0000bad0"
BIG_RUN = "r-00001000"
SCRIPT = "<script>window.__pwned = 'script'</script>"
IMAGE = "<img src=x onerror=\"window.__pwned = 'img'\">"


def seed(server: LiveServer, run_id: str, steps: dict[int, list[RolloutRecord]]) -> None:
    engine = make_engine(f"sqlite:///{server.var_dir / 'rlcs.db'}")
    try:
        seed_run(engine, run_id, steps, per_step=4096)
    finally:
        engine.dispose()


def hostile(index: int, reward: float) -> RolloutRecord:
    prompt = f"Repeat after me: {IMAGE} <b>bold</b>"
    completion = f"{SCRIPT} and {IMAGE}"
    return RolloutRecord(
        kind="episode",
        group=0,
        index=index,
        prompt=prompt,
        completion=completion,
        reward=reward,
        advantage=reward - 0.5,
        segments=[Segment("env", prompt, 9), Segment("model", completion, 12, reward=reward)],
        finish_reason="stop",
    )


@pytest.fixture(scope="module")
def real_run(api: httpx.Client) -> str:
    run_id = start_run(api, environment="arithmetic", total_steps=2, steps_per_eval=0, **TINY_RUN)
    run = finish_run(api, run_id, timeout=RUN_START_S * 2)
    assert run["status"] == "succeeded", run
    return run_id


def test_a_real_runs_episodes_by_step_group_and_reward(
    page: Page, live_server: LiveServer, api: httpx.Client, real_run: str
) -> None:
    per_step = TINY_RUN["group_size"] * TINY_RUN["batch_size"]
    view = open_route(page, live_server, f"runs/{real_run}", "run").get_by_test_id("rollouts")
    # The newest step first.
    expect(view.get_by_test_id("rollouts-step-label")).to_contain_text("step 2 (1–2)")
    rows = view.locator("[data-testid=rollouts-table] .rollout-row[data-at]")
    expect(rows).to_have_count(per_step)
    expect(view.get_by_test_id("rollouts-summary")).to_contain_text(
        f"{per_step} episodes sampled, {per_step} kept"
    )
    # The slider to step 1: its episodes, with the rewards the API has.
    slider = view.get_by_test_id("rollouts-step")
    slider.fill("0")
    expect(view.get_by_test_id("rollouts-step-label")).to_contain_text("step 1 (1–2)")
    step1 = api.get(f"/runs/{real_run}/rollouts", params={"step": 1}).json()["items"]
    expect(view.get_by_test_id("rollouts-summary")).to_contain_text("step 1:")
    expect(rows.locator("[data-col=completion]")).to_have_text(
        [i["completion"][:160] for i in step1]
    )
    # Best and worst, each with the environment's text and the model's apart.
    for end in ("rollouts-best", "rollouts-worst"):
        card = view.get_by_test_id(end).locator(".rollout-card")
        expect(card.locator(".seg[data-role=env]")).to_have_count(1)
        expect(card.locator(".seg[data-role=model]")).to_have_count(1)
    best = max(i["reward"] for i in step1)
    first_best = next(i for i in step1 if i["reward"] == best)
    expect(view.get_by_test_id("rollouts-best").locator(".rollout-card")).to_have_attribute(
        "data-index", str(first_best["index"])
    )
    # A group side by side: its episodes, each with its reward and advantage.
    rows.first.get_by_test_id("rollout-group").click()
    group = view.get_by_test_id("rollouts-group-view")
    expect(group.locator(".rollout-card")).to_have_count(TINY_RUN["group_size"])
    expect(group.locator(".rollout-head").first).to_contain_text("advantage")
    # The reward filter: only the episodes in range.
    high = [i for i in step1 if i["reward"] >= best]
    view.get_by_test_id("rollouts-min-reward").fill(str(best))
    view.get_by_test_id("rollouts-min-reward").dispatch_event("change")
    expect(rows).to_have_count(len(high))
    screenshot(page, "rollouts-real-run")


def test_episode_text_stays_text(page: Page, live_server: LiveServer) -> None:
    seed(live_server, HOSTILE_RUN, {1: [hostile(0, 1.0), hostile(1, 0.0)]})
    view = open_route(page, live_server, f"runs/{HOSTILE_RUN}", "run").get_by_test_id("rollouts")
    cells = view.locator("[data-col=completion]")
    expect(cells).to_have_text([f"{SCRIPT} and {IMAGE}"] * 2)
    view.get_by_test_id("rollout-open").first.click()
    episode_view = view.get_by_test_id("rollouts-episode")
    expect(episode_view.locator(".seg[data-role=env]")).to_have_text(
        f"Repeat after me: {IMAGE} <b>bold</b>"
    )
    expect(episode_view.locator(".seg[data-role=model]")).to_have_text(f"{SCRIPT} and {IMAGE}")
    episode_view.get_by_test_id("rollout-prompt").click()
    expect(view.get_by_test_id("rollouts-prompt-view")).to_contain_text(SCRIPT)
    # Shown as text everywhere: no element made of it, nothing of it ran.
    expect(view.locator("img")).to_have_count(0)
    expect(view.locator("script")).to_have_count(0)
    expect(view.locator("b")).to_have_count(0)
    assert page.evaluate("window.__pwned") is None
    screenshot(page, "rollouts-escaped")


def test_a_step_of_a_thousand_episodes_and_one_prompt_across_steps(
    page: Page, live_server: LiveServer
) -> None:
    big = [episode(i, (i % 10) / 10, group=i // 8) for i in range(1000)]
    repeated = {s: [episode(0, s / 10, prompt="Same task every step")] for s in (2, 3, 4)}
    seed(live_server, BIG_RUN, {1: big, **repeated})
    view = open_route(page, live_server, f"runs/{BIG_RUN}", "run").get_by_test_id("rollouts")
    view.get_by_test_id("rollouts-step").fill("0")
    rows = view.locator("[data-testid=rollouts-table] .rollout-row[data-at]")
    expect(rows).to_have_count(1000)
    expect(view.get_by_test_id("rollouts-summary")).to_contain_text(
        "1000 episodes sampled, 1000 kept"
    )
    expect(view.get_by_test_id("rollouts-best")).to_contain_text("reward 0.9")
    expect(view.get_by_test_id("rollouts-worst")).to_contain_text("reward 0")
    # One prompt's completions across the steps that saw it.
    view.get_by_test_id("rollouts-step").fill("3")
    expect(rows).to_have_count(1)
    rows.first.get_by_test_id("rollout-open").click()
    view.get_by_test_id("rollouts-episode").get_by_test_id("rollout-prompt").click()
    across = view.get_by_test_id("rollouts-prompt-view")
    expect(across).to_contain_text("One prompt across 3 steps")
    expect(across.locator(".prompt-step")).to_have_count(3)
    expect(across.locator(".prompt-step .rollout-head")).to_have_text(
        ["step 2: mean reward 0.200", "step 3: mean reward 0.300", "step 4: mean reward 0.400"]
    )
