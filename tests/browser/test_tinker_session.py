"""A Tinker SDK session in the dashboard, in a real browser: a script's session (the real SDK
against the live server, on tiny-random) listed and shown under the name the script gave it,
its step without a total, no Resume button (resume is the script's, from a saved state), and
the charts of what a session records: loss, grad norm, learning rate and tokens."""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.browser.test_dashboard import open_route
from tests.support.helpers import wait_for
from tests.support.live_server import LiveServer

expect = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed (the dev extra)"
).expect
tinker = pytest.importorskip("tinker")

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.timeout(600)

NAME = "grid-search <b>7</b>"  # a name holding markup stays text
STEPS = 2
SESSION_METRICS = [
    "train/loss",
    "train/grad_norm",
    "train/learning_rate",
    "train/tokens",
]


@pytest.fixture(scope="module")
def session_run(live_server: LiveServer, api: httpx.Client) -> str:
    """A script's session of STEPS optimizer steps, closed; the run it became."""
    from tinker import types

    service = tinker.ServiceClient(
        base_url=live_server.url, api_key="tml-dashboard", display_name=NAME
    )
    try:
        training = service.create_lora_training_client(base_model="tiny-random", rank=4).result(120)
        datum = types.Datum(
            model_input=types.ModelInput.from_ints([1, 2, 3, 4, 5]),
            loss_fn_inputs={"target_tokens": [2, 3, 4, 5, 6], "weights": [0, 0, 1, 1, 1]},
        )
        for _ in range(STEPS):
            training.forward_backward([datum], "cross_entropy").result(120)
            training.optim_step(types.AdamParams(learning_rate=1e-3)).result(120)
    finally:
        with contextlib.suppress(Exception):
            service.close("success").result(60)
    sessions = wait_for(
        lambda: api.get("/runs", params={"source": "tinker-api"}).json() or None, 30, every=0.2
    )
    (run,) = sessions
    assert run["display_name"] == NAME and run["step"] == STEPS and run["total_steps"] == 0
    return str(run["run_id"])


def test_a_session_shows_its_name_its_step_and_its_charts_without_resume(
    page: Page, live_server: LiveServer, session_run: str
) -> None:
    runs = open_route(page, live_server, "runs", "runs")
    row = runs.locator(f'tr[data-run-id="{session_run}"]')
    expect(row.get_by_test_id("run-name")).to_have_text(NAME)
    expect(row.locator("td[data-col=step]")).to_have_text(str(STEPS))

    view = open_route(page, live_server, f"runs/{session_run}", "run")
    expect(view.get_by_test_id("run-name")).to_have_text(NAME)
    expect(view.get_by_test_id("run-step")).to_have_text(re.compile(rf"^\s*{STEPS}\s*$"))
    expect(view.get_by_test_id("run-status")).to_have_text("succeeded")
    expect(view.get_by_test_id("resume-run")).to_be_hidden()
    charts = view.get_by_test_id("charts")
    for metric in SESSION_METRICS:
        chart = charts.locator(f'[data-metric="{metric}"]')
        expect(chart).to_have_attribute("data-points", str(STEPS))


def test_rlctl_shows_a_sessions_name_and_step_without_a_total(
    live_server: LiveServer, session_run: str
) -> None:
    from tests.support.rlctl import run_cli

    shown = run_cli(live_server.url, "runs", "status", session_run)
    assert shown.returncode == 0, shown.stderr
    pairs = [line.split(None, 1) for line in shown.stdout.splitlines()]
    lines = {p[0]: p[1].strip() for p in pairs if len(p) == 2}
    assert (lines["name"], lines["step"], lines["source"]) == (NAME, str(STEPS), "tinker-api")
