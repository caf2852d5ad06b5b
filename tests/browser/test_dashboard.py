"""The dashboard in a real browser against a live server and real tiny-random runs: start a run
from the form and stop it, the runs list, comparing two runs, a rejected config value, trying
the model, the engine page's hosts, and the connection indicator across a server restart.

Only the page's DOM contract is used (data-testid, data-page, data-col, data-metric, ...); the
REST API sets up state and checks what the page did. The page is waited on through
Playwright's auto-waiting `expect` and `wait_for_function`, never with sleeps; the API side
(runs set up for the test) through tests.support.helpers.wait_for."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
import pytest

from tests.browser.conftest import ConsoleErrors, screenshot, shut_down
from tests.support.engine_answers import two_hosts
from tests.support.helpers import FINISHED, TINY_RUN, finish_run, run_of, start_run, wait_for
from tests.support.live_server import LiveServer

expect = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed (the dev extra)"
).expect

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page, Route

pytestmark = pytest.mark.timeout(600)

# Real runs on a busy machine: a runner imports torch before its first step.
RUN_START_S = 180
STEP_S = 90
INFERENCE_S = 180
STEP_TEXT = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
# Stored as arithmetic's config, so the form's defaults and the try page use a tiny model.
TINY_CONFIG = {**TINY_RUN, "steps_per_eval": 0}


@pytest.fixture(scope="module", autouse=True)
def tiny_arithmetic(api: httpx.Client) -> None:
    resp = api.put("/environments/arithmetic/config", json={"values": TINY_CONFIG})
    assert resp.status_code == 200, resp.text


def open_route(page: Page, server: LiveServer, route: str, name: str) -> Locator:
    """Open `/#/<route>` and wait for the page `name` (main[data-page=name]) to be shown."""
    page.goto(f"{server.url}/#/{route}")
    root = page.locator(f"main[data-page={name}]")
    expect(root).to_be_visible()
    expect(page.get_by_test_id("conn-status")).to_have_text("connected")
    return root


def step_of(page: Page) -> tuple[int, int]:
    text = page.get_by_test_id("run-step").inner_text()
    match = STEP_TEXT.match(text)
    assert match, f"run-step text {text!r} is not '<step> / <total>'"
    return int(match[1]), int(match[2])


def wait_step_above(page: Page, step: int, timeout_s: float) -> int:
    """Wait until run-step shows a step above `step`; that step."""
    page.wait_for_function(
        """(step) => {
            const el = document.querySelector('[data-testid=run-step]');
            const m = el && el.textContent.match(/^\\s*(\\d+)\\s*\\/\\s*(\\d+)\\s*$/);
            return m !== null && m !== undefined && Number(m[1]) > step;
        }""",
        arg=step,
        timeout=timeout_s * 1000,
    )
    return step_of(page)[0]


def chart_points(page: Page, scope: str) -> dict[str, int]:
    """{metric: data-points} of the charts under `scope`."""
    return page.eval_on_selector_all(
        f"{scope} div.chart[data-metric]",
        """charts => Object.fromEntries(charts.map(
            c => [c.dataset.metric, Number(c.getAttribute('data-points'))]))""",
    )


def create_run(api: httpx.Client, **overrides: object) -> str:
    return start_run(api, environment="arithmetic", **TINY_RUN, **{"save_every": 0, **overrides})


def finish(api: httpx.Client, run_id: str, timeout: float = 300) -> dict:
    return finish_run(api, run_id, timeout)


def stop(api: httpx.Client, run_id: str) -> dict:
    api.post(f"/runs/{run_id}/stop")
    return finish(api, run_id, 120)


def test_start_a_run_from_the_form_watch_it_and_stop_it(
    page: Page, live_server: LiveServer, api: httpx.Client
) -> None:
    open_route(page, live_server, "new/arithmetic", "new")
    expect(page.get_by_test_id("env-select")).to_have_value("arithmetic")
    form = page.locator("form[data-testid=config-form]")
    # The stored config is the form's starting point ...
    expect(form.locator('[name="model_name"]')).to_have_value("tiny-random")
    expect(form.locator('[name="lora_rank"]')).to_have_value("8")
    expect(form.locator('[name="use_wandb"]')).not_to_be_checked()
    # ... and what is typed in goes into the run.
    form.locator('[name="total_steps"]').fill("300")
    form.locator('[name="save_every"]').fill("0")
    form.locator('[name="group_size"]').fill("4")
    form.locator('[name="batch_size"]').fill("2")
    form.locator('[name="max_token_length"]').fill("8")
    page.get_by_test_id("start-run").click()

    expect(page).to_have_url(re.compile(r"#/runs/r-[0-9a-f]{8}$"))
    run_id = page.url.rsplit("/", 1)[1]
    try:
        expect(page.locator("main[data-page=run]")).to_be_visible()
        run_config = page.get_by_test_id("run-config")
        expect(run_config).to_contain_text("total_steps")
        config = json.loads(run_config.inner_text())
        picked = {
            k: config.get(k) for k in ("model_name", "total_steps", "save_every", "lora_rank")
        }
        assert picked == {
            "model_name": "tiny-random",
            "total_steps": 300,
            "save_every": 0,
            "lora_rank": 8,
        }, f"run-config shows {picked}"
        assert run_of(api, run_id)["total_steps"] == 300

        status = page.get_by_test_id("run-status")
        expect(status).to_have_text("running", timeout=RUN_START_S * 1000)
        # The step rises, live, and so do the charts' points.
        first = wait_step_above(page, 0, RUN_START_S)
        assert step_of(page)[1] == 300
        charts = "[data-testid=charts]"
        expect(page.locator(f"{charts} div.chart[data-metric]").first).to_be_visible(
            timeout=STEP_S * 1000
        )
        before = chart_points(page, charts)
        wait_step_above(page, first + 1, STEP_S)
        page.wait_for_function(
            """(before) => [...document.querySelectorAll(
                    '[data-testid=charts] div.chart[data-metric]')].some(
                c => Number(c.getAttribute('data-points')) > (before[c.dataset.metric] ?? 0))""",
            arg=before,
            timeout=STEP_S * 1000,
        )
        after = chart_points(page, charts)
        grown = [m for m, n in after.items() if n > before.get(m, 0)]
        assert grown, f"no chart gained points: before {before}, after {after}"
        expect(page.get_by_test_id("run-log")).not_to_be_empty(timeout=STEP_S * 1000)
        expect(page.get_by_test_id("checkpoints")).to_be_attached()
        screenshot(page, "run")

        page.get_by_test_id("stop-run").click()
        expect(page.get_by_test_id("action-result")).to_contain_text(re.compile("stopping", re.I))
        expect(status).to_have_text("stopped", timeout=120_000)
        log_end = page.get_by_test_id("log-end")
        expect(log_end).to_be_visible(timeout=60_000)
        expect(log_end).to_contain_text("stopped")
        assert run_of(api, run_id)["status"] == "stopped"
    finally:
        if run_of(api, run_id)["status"] not in FINISHED:
            stop(api, run_id)


def test_runs_list_shows_runs_with_status_and_step(
    page: Page, live_server: LiveServer, api: httpx.Client
) -> None:
    run_id = create_run(api, total_steps=300)
    try:
        wait_for(lambda: run_of(api, run_id)["step"] >= 1, RUN_START_S, every=0.2)
        runs = open_route(page, live_server, "runs", "runs")
        table = runs.locator("table[data-testid=runs-table]")
        row = table.locator(f'tr[data-run-id="{run_id}"]')
        expect(row).to_be_visible()
        expect(row.locator("td[data-col=status]")).to_have_text("running")
        expect(row.locator("td[data-col=step]")).to_have_text(re.compile(r"^\s*\d+ / 300\s*$"))
        expect(row.locator("td[data-col=environment]")).to_have_text("arithmetic")
        expect(row.locator("td[data-col=model]")).to_have_text("tiny-random")
        for col in ("reward", "eta", "stalled", "failure"):
            expect(row.locator(f"td[data-col={col}]")).to_have_count(1)
        # What it spent so far: no price is set here, so its device time and tokens.
        expect(row.locator("td[data-col=cost]")).to_have_text(
            re.compile(r"^\S+ (s|min|h) · \S+ tok$")
        )
        expect(row.get_by_test_id("pick")).to_have_count(1)
        expect(row.get_by_test_id("run-link")).to_have_attribute(
            "href", re.compile(rf"#/runs/{run_id}$")
        )
        expect(runs.get_by_test_id("page-prev")).to_have_count(1)
        expect(runs.get_by_test_id("page-next")).to_have_count(1)
        screenshot(page, "runs")

        # Filters: by environment, then by status.
        env_filter = runs.get_by_test_id("filter-env")
        env_filter.select_option("repeat_word")
        expect(row).to_have_count(0)
        env_filter.select_option("arithmetic")
        expect(row).to_be_visible()
        status_filter = runs.get_by_test_id("filter-status")
        status_filter.select_option("succeeded")
        expect(row).to_have_count(0)
        status_filter.select_option("running")
        expect(row).to_be_visible()

        # The run link opens the run's page.
        row.get_by_test_id("run-link").click()
        expect(page).to_have_url(re.compile(rf"#/runs/{run_id}$"))
        expect(page.locator("main[data-page=run]")).to_be_visible()
        expect(page.get_by_test_id("run-status")).to_have_text("running")
        expect(page.get_by_test_id("run-cost-note")).to_contain_text("no price set")

        # Stopped behind the page's back: the list, shown again and filtered, says so.
        stop(api, run_id)
        page.locator("a[data-testid=nav-runs]").click()
        expect(page.locator("main[data-page=runs]")).to_be_visible()
        page.get_by_test_id("filter-status").select_option("stopped")
        row = page.locator(f'table[data-testid=runs-table] tr[data-run-id="{run_id}"]')
        expect(row.locator("td[data-col=status]")).to_have_text("stopped", timeout=60_000)
    finally:
        if run_of(api, run_id)["status"] not in FINISHED:
            stop(api, run_id)


def test_a_run_shows_the_sampler_trainer_gap_in_a_group_of_its_own(
    page: Page, live_server: LiveServer, api: httpx.Client
) -> None:
    """Issue 53: a run that trained (repeat_word's dense reward: tiny-random's arithmetic
    earns none and trains nothing) charts mismatch/* in a `mismatch` group."""
    run_id = start_run(
        api,
        environment="repeat_word",
        **{**TINY_RUN, "total_steps": 2, "save_every": 0, "steps_per_eval": 0},
    )
    assert finish(api, run_id)["status"] == "succeeded", run_of(api, run_id)
    open_route(page, live_server, f"runs/{run_id}", "run")
    mismatch = page.locator("[data-testid=charts] [data-group=mismatch]")
    for key in ("k3", "abs_max", "abs_mean", "ratio_outside", "corrected"):
        chart = mismatch.locator(f'div.chart[data-metric="mismatch/{key}"]')
        expect(chart).to_be_visible(timeout=60_000)
        expect(chart).to_have_attribute("data-points", re.compile(r"^[1-9]"))


def test_compare_two_runs(page: Page, live_server: LiveServer, api: httpx.Client) -> None:
    slow = create_run(api, total_steps=3, learning_rate=1e-4)
    fast = create_run(api, total_steps=3, learning_rate=2e-4)
    for run_id in (slow, fast):
        assert finish(api, run_id)["status"] == "succeeded", run_of(api, run_id)

    runs = open_route(page, live_server, "runs", "runs")
    for run_id in (slow, fast):
        pick = runs.locator(f'tr[data-run-id="{run_id}"] input[data-testid=pick]')
        pick.check()
        expect(pick).to_be_checked()
    runs.get_by_test_id("compare-selected").click()

    expect(page).to_have_url(re.compile(r"#/compare/r-[0-9a-f]{8},r-[0-9a-f]{8}$"))
    assert set(page.url.rsplit("/", 1)[1].split(",")) == {slow, fast}
    compare = page.locator("main[data-page=compare]")
    expect(compare).to_be_visible()
    charts = compare.locator("[data-testid=compare-charts] div.chart[data-metric]")
    expect(charts.first).to_have_attribute("data-series", "2", timeout=60_000)
    series = {c.get_attribute("data-metric"): c.get_attribute("data-series") for c in charts.all()}
    assert series and all(n == "2" for n in series.values()), f"data-series by metric: {series}"

    diff = compare.locator("table[data-testid=config-diff]")
    lr = diff.locator('tr[data-field="learning_rate"]')
    expect(lr).to_be_visible()
    expect(lr).to_contain_text(re.compile(r"0\.0001|1(\.0*)?e-0?4", re.I))
    expect(lr).to_contain_text(re.compile(r"0\.0002|2(\.0*)?e-0?4", re.I))
    expect(diff.locator('tr[data-field="model_name"]')).to_have_count(0)  # the same in both
    screenshot(page, "compare")


def test_new_run_form_shows_the_servers_error_for_a_bad_value(
    page: Page, live_server: LiveServer, api: httpx.Client, console_errors: ConsoleErrors
) -> None:
    # The refused PUT is the point of the test; the browser logs it as a failed load.
    console_errors.allow(r"status of 422")
    open_route(page, live_server, "runs", "runs")
    page.locator("a[data-testid=nav-new]").click()
    expect(page.locator("main[data-page=new]")).to_be_visible()
    # The environment picked shows that environment's stored config.
    form = page.locator("form[data-testid=config-form]")
    page.get_by_test_id("env-select").select_option("repeat_word")
    expect(form.locator('[name="model_name"]')).not_to_have_value("tiny-random")
    page.get_by_test_id("env-select").select_option("arithmetic")
    expect(form.locator('[name="model_name"]')).to_have_value("tiny-random")
    expect(form.locator('[name="lora_rank"]')).to_have_value("8")
    expect(form.locator('[name="tokenizer_name"]')).to_be_disabled()  # locked by the server
    expect(form.locator('[name="use_wandb"]')).to_have_attribute("type", "checkbox")
    expect(form.locator('[name="loss_fn"]')).to_have_js_property("tagName", "SELECT")
    expect(form.locator('[name="lora_rank"]')).to_have_attribute("type", "number")
    screenshot(page, "new-run")

    form.locator('[name="lora_rank"]').fill("0")
    page.get_by_test_id("save-config").click()
    error = page.locator('[data-error-for="lora_rank"]')
    expect(error).to_contain_text("lora_rank")
    expect(error).to_contain_text("greater than or equal to 1")
    screenshot(page, "config-error")
    stored = api.get("/environments/arithmetic/config").json()["configurable_fields"]
    assert stored["lora_rank"] == 8  # nothing was saved

    # A good value saves, and the server has it.
    form.locator('[name="lora_rank"]').fill("8")
    form.locator('[name="eval_num_tasks"]').fill("8")
    page.get_by_test_id("save-config").click()
    expect(page.get_by_test_id("form-result")).to_contain_text(re.compile("saved", re.I))
    stored = api.get("/environments/arithmetic/config").json()["configurable_fields"]
    assert stored["eval_num_tasks"] == 8 and stored["lora_rank"] == 8
    assert stored["model_name"] == "tiny-random"


def test_try_the_model_on_two_prompts(page: Page, live_server: LiveServer) -> None:
    prompts = ["What is 2 + 3?", "What is 7 * 6?"]
    open_route(page, live_server, "runs", "runs")
    page.locator("a[data-testid=nav-try]").click()
    expect(page.locator("main[data-page=try]")).to_be_visible()
    page.get_by_test_id("try-env").select_option("arithmetic")
    page.get_by_test_id("try-source-a").select_option("base")
    page.get_by_test_id("try-source-b").select_option("none")
    page.get_by_test_id("try-prompts").fill("\n".join(prompts))
    page.get_by_test_id("try-max-tokens").fill("8")
    page.get_by_test_id("try-go").click()

    results = page.get_by_test_id("try-results")
    columns = results.locator(".try-column[data-source]")
    items = columns.first.locator(".try-item")
    expect(items).to_have_count(2, timeout=INFERENCE_S * 1000)
    expect(columns).to_have_count(1)
    for error in page.get_by_test_id("try-error").all():  # there, empty, or not there at all
        expect(error).to_be_empty()
    for item, prompt in zip(items.all(), prompts, strict=True):
        expect(item).to_contain_text(prompt)
        # The score is the item's data-score (or that of an element inside it).
        score = item.get_attribute("data-score")
        if score is None:
            score = item.locator("[data-score]").first.get_attribute("data-score")
        assert score is not None and 0.0 <= float(score) <= 1.0, f"data-score {score!r}"
    screenshot(page, "try")


def test_the_engine_page_shows_the_host_its_models_and_a_running_run(
    page: Page, live_server: LiveServer, api: httpx.Client
) -> None:
    run_id = create_run(api, total_steps=400)
    try:
        wait_for(lambda: run_of(api, run_id)["step"] >= 1, RUN_START_S)
        hosts = api.get("/engine").json()["hosts"]
        root = open_route(page, live_server, "engine", "engine")
        expect(page.locator("a[data-testid=nav-engine]")).to_have_class(re.compile("active"))
        expect(root.get_by_test_id("engine-host")).to_have_count(len(hosts))
        expect(root.get_by_test_id("engine-node")).to_contain_text(f"{len(hosts)} host(s), ")
        # The host the run was placed on (the machine's one on a CPU; a GPU machine has more).
        placed = page.locator(f"tr[data-client='run {run_id}']")
        host = root.locator("[data-testid=engine-host]", has=placed)
        expect(host).to_have_attribute("data-running", "true")
        expect(host).to_have_attribute("data-host", re.compile(r"^.+/\d+$"))
        expect(host.get_by_test_id("engine-device")).to_have_text(re.compile(r"^(cpu|cuda:\d+)$"))
        expect(host.get_by_test_id("engine-summary")).to_contain_text("pid ")
        expect(host.get_by_test_id("engine-memory")).to_contain_text(
            re.compile(r"\d+ [KMG]iB resident .*budget \d")
        )
        base = host.locator("[data-testid=engine-bases] tr[data-base=tiny-random]")
        expect(base.locator("td[data-col=users]")).to_have_text(re.compile(r"^[1-9]\d*$"))
        expect(base.locator("td[data-col=state]")).to_have_text("loaded")
        lanes = host.locator("[data-testid=engine-lanes] tr[data-base=tiny-random]")
        expect(lanes).to_have_count(2)  # RLCS_TRAINING_LANES: 2
        client = host.locator(f"[data-testid=engine-clients] tr[data-client='run {run_id}']")
        expect(client).to_be_visible()
        expect(client.locator("a")).to_have_attribute("href", f"#/runs/{run_id}")
        expect(client.locator("td[data-col=bases]")).to_have_text("tiny-random")
        screenshot(page, "engine")
    finally:
        stop(api, run_id)


def test_the_engine_page_shows_every_host_its_lanes_and_gpu_memory(
    page: Page, live_server: LiveServer
) -> None:
    # A machine with two GPUs, as tests/support/engine_answers.py answers: GET /engine
    # is answered by the browser here, so the page's every part shows without a GPU.
    def answer(route: Route) -> None:
        route.fulfill(json=two_hosts(time.time()))

    page.route(lambda url: urlsplit(url).path == "/engine", answer)
    root = open_route(page, live_server, "engine", "engine")
    expect(root.get_by_test_id("engine-node")).to_have_text("Machine box: 2 host(s), 1 running.")
    hosts = root.get_by_test_id("engine-host")
    expect(hosts).to_have_count(2)
    assert [h.get_attribute("data-host") for h in hosts.all()] == ["box/0", "box/1"]

    gpu = root.locator("[data-testid=engine-host][data-host='box/0']")
    expect(gpu.get_by_test_id("engine-device")).to_have_text("cuda:0")
    expect(gpu.get_by_test_id("engine-summary")).to_contain_text("pid 4242, up 13 min")
    expect(gpu.get_by_test_id("engine-memory")).to_have_text(
        "Memory: 2.5 GiB resident · GPU 140.0 GiB, 100.0 GiB free · budget 63.0 GiB"
    )
    bases = gpu.locator("[data-testid=engine-bases] tbody tr")
    expect(bases).to_have_count(2)
    expect(bases.nth(0)).to_have_attribute("data-base", "Qwen/Qwen3-8B")
    expect(bases.nth(0).locator("td")).to_have_text(["Qwen/Qwen3-8B", "16.0 GiB", "3", "loaded"])
    expect(bases.nth(1).locator("td")).to_have_text(["tiny-random", "354 KiB", "1", "loading"])
    lanes = gpu.locator("[data-testid=engine-lanes] tbody tr")
    expect(lanes).to_have_count(2)
    expect(lanes.nth(0).locator("td")).to_have_text(["Qwen/Qwen3-8B", "0", "yes", "2"])
    expect(lanes.nth(1).locator("td")).to_have_text(["Qwen/Qwen3-8B", "1", "no", "0"])
    client = gpu.locator("[data-testid=engine-clients] tr[data-client='run r-0000abcd']")
    expect(client.locator("td[data-col=samplers]")).to_have_text("2")

    idle = root.locator("[data-testid=engine-host][data-host='box/1']")
    expect(idle).to_have_attribute("data-running", "false")
    expect(idle.get_by_test_id("engine-device")).to_have_text("gpu 1")
    expect(idle.get_by_test_id("engine-summary")).to_contain_text("Not running")
    expect(idle.get_by_test_id("engine-log")).to_contain_text("/srv/var/engine/box/1/host.log")
    expect(idle.locator("table")).to_have_count(0)
    screenshot(page, "engine-hosts")


def test_connection_indicator_follows_the_server(
    page: Page, tmp_path: Path, console_errors: ConsoleErrors
) -> None:
    # While the server is down the browser logs the refused requests.
    console_errors.allow(r"ERR_CONNECTION_REFUSED|ERR_CONNECTION_RESET|ERR_EMPTY_RESPONSE")
    console_errors.allow(r"Failed to fetch|NetworkError|ERR_INCOMPLETE_CHUNKED_ENCODING")
    first = LiveServer(tmp_path / "var").start(timeout=60)
    second: LiveServer | None = None
    try:
        open_route(page, first, "runs", "runs")
        status = page.get_by_test_id("conn-status")
        first.kill(signal.SIGTERM)
        expect(status).to_have_text("disconnected", timeout=60_000)

        # The same address again: a new server on the first one's port.
        second = LiveServer(tmp_path / "var")
        second.port = first.port
        second.url = first.url
        second.env["RLCS_PORT"] = str(first.port)
        second.start(timeout=60)
        expect(status).to_have_text("connected", timeout=60_000)
        expect(page.locator("table[data-testid=runs-table]")).to_be_visible()
    finally:
        shut_down(first)
        if second is not None:
            shut_down(second)
