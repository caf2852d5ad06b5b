"""Where runs come from, in a real browser against a live server and real tiny-random runs: a
sweep of two runs on the sweeps pages (live, its runs side by side, the best one marked), a
fork's page linking its parent (and the parent listing its fork), and each run's source in the
runs table, filterable.

Like test_dashboard.py: only the page's DOM contract is used, the REST API sets up state, and
the page is waited on through Playwright's auto-waiting `expect`, never with sleeps."""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.browser.conftest import screenshot
from tests.browser.test_dashboard import RUN_START_S, open_route, stop
from tests.support.helpers import FINISHED, TINY_RUN, run_of, wait_for
from tests.support.live_server import LiveServer

expect = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed (the dev extra)"
).expect

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.timeout(600)

LEARNING_RATES = [1e-4, 2e-4]


@dataclass
class SweepMade:
    sweep_id: str
    run_ids: list[str]


@pytest.fixture(scope="module")
def sweep(api: httpx.Client) -> SweepMade:
    """Two tiny runs of two steps, one per learning rate, started when the module begins."""
    resp = api.post(
        "/sweeps",
        json={
            "environment": "arithmetic",
            "base": {**TINY_RUN, "total_steps": 2, "save_every": 1, "steps_per_eval": 0},
            "grid": {"learning_rate": LEARNING_RATES},
            "metric": "reward_mean",
        },
    )
    assert resp.status_code == 200, resp.text
    made = resp.json()
    return SweepMade(made["sweep_id"], made["run_ids"])


def finished_sweep(api: httpx.Client, sweep_id: str) -> dict:
    return wait_for(
        lambda: (s := api.get(f"/sweeps/{sweep_id}").json())["status"] == "finished" and s,
        RUN_START_S * 2,
        every=0.2,
    )


def test_a_sweep_shows_its_runs_side_by_side_with_the_best_marked(
    page: Page, live_server: LiveServer, api: httpx.Client, sweep: SweepMade
) -> None:
    # The list: the sweep is there, and its link opens the sweep's page while it still runs.
    open_route(page, live_server, "runs", "runs")
    page.locator("a[data-testid=nav-sweeps]").click()
    sweeps = page.locator("main[data-page=sweeps]")
    listed = sweeps.locator(f'table[data-testid=sweeps-table] tr[data-sweep-id="{sweep.sweep_id}"]')
    expect(listed.locator("td[data-col=environment]")).to_have_text("arithmetic")
    expect(listed.locator("td[data-col=metric]")).to_have_text("reward_mean (max)")
    expect(listed.locator("td[data-col=runs]")).to_have_text(re.compile(r"^\s*\d / 2\s*$"))
    listed.get_by_test_id("sweep-link").click()
    expect(page).to_have_url(re.compile(rf"#/sweeps/{sweep.sweep_id}$"))
    view = page.locator("main[data-page=sweep]")
    expect(view.get_by_test_id("sweep-id")).to_have_text(sweep.sweep_id)
    expect(page.locator("header nav a.active")).to_have_text("Sweeps")

    # One row per run, the overridden field as a column; the page follows the runs to the end.
    table = view.locator("table[data-testid=sweep-runs]")
    rows = table.locator("tbody tr[data-run-id]")
    expect(rows).to_have_count(2)
    expect(table.locator('th[data-field="learning_rate"]')).to_have_count(1)
    for run_id, lr in zip(sweep.run_ids, LEARNING_RATES, strict=True):
        cell = table.locator(f'tr[data-run-id="{run_id}"] td[data-field="learning_rate"]')
        assert float(cell.inner_text()) == lr
    expect(view.get_by_test_id("sweep-status")).to_have_text("finished", timeout=RUN_START_S * 2000)
    done = finished_sweep(api, sweep.sweep_id)
    assert {r["status"] for r in done["runs"]} == {"succeeded"}, done["runs"]
    best = done["best"]
    assert best is not None and best["final"], done
    for run in done["runs"]:
        row = table.locator(f'tr[data-run-id="{run["run_id"]}"]')
        expect(row.locator("td[data-col=status]")).to_have_text("succeeded")
        expect(row.locator("td[data-col=step]")).to_have_text(re.compile(r"^\s*2 / 2\s*$"))
        assert float(row.locator("td[data-col=value]").inner_text()) == pytest.approx(
            run["value"], rel=1e-2, abs=1e-3
        )
    marked = table.locator("tr[data-best=true]")
    expect(marked).to_have_count(1)
    expect(marked).to_have_attribute("data-run-id", best["run_id"])
    expect(marked.get_by_test_id("best-mark")).to_have_text("★ best")
    expect(view.get_by_test_id("best-run")).to_contain_text(best["run_id"])
    expect(view.get_by_test_id("stop-sweep")).to_be_disabled()  # nothing left to stop
    screenshot(page, "sweep")

    # Both picked: Compare selected opens the compare page on them.
    view.get_by_test_id("pick-all").check()
    view.get_by_test_id("compare-selected").click()
    expect(page).to_have_url(re.compile(r"#/compare/r-[0-9a-f]{8},r-[0-9a-f]{8}$"))
    assert set(page.url.rsplit("/", 1)[1].split(",")) == set(sweep.run_ids)
    page.go_back()

    # The best run's link opens its page, which links back to the sweep.
    marked.get_by_test_id("run-link").click()
    expect(page).to_have_url(re.compile(rf"#/runs/{best['run_id']}$"))
    expect(page.get_by_test_id("run-id")).to_have_text(best["run_id"])
    expect(page.get_by_test_id("sweep-link")).to_have_attribute(
        "href", f"#/sweeps/{sweep.sweep_id}"
    )


def test_a_fork_links_its_parent_and_the_table_shows_each_runs_source(
    page: Page, live_server: LiveServer, api: httpx.Client, sweep: SweepMade
) -> None:
    finished_sweep(api, sweep.sweep_id)
    parent, other = sweep.run_ids
    resp = api.post(f"/runs/{parent}/fork", json={"total_steps": 3})
    assert resp.status_code == 200, resp.text
    fork, at = resp.json()["run_id"], resp.json()["parent_step"]
    try:
        # The fork's page: "fork of <parent> at step N", the link opens the parent's page,
        # which lists the fork.
        open_route(page, live_server, f"runs/{fork}", "run")
        fork_of = page.get_by_test_id("fork-of")
        expect(fork_of).to_have_text(f"fork of {parent} at step {at}")
        expect(page.get_by_test_id("source-label")).to_have_text("API")
        fork_of.get_by_test_id("parent-link").click()
        expect(page).to_have_url(re.compile(rf"#/runs/{parent}$"))
        expect(page.get_by_test_id("run-id")).to_have_text(parent)
        expect(page.get_by_test_id("fork-of")).to_have_count(0)  # the parent is no fork
        expect(page.get_by_test_id("forks").get_by_test_id("fork-link")).to_have_attribute(
            "href", f"#/runs/{fork}"
        )

        # A run started elsewhere: a Tinker SDK session (where the server records sources).
        tinker = other if "source" in run_of(api, other) else None
        if tinker is not None:
            with sqlite3.connect(live_server.var_dir / "rlcs.db") as db:
                db.execute("UPDATE run SET source = 'tinker-api' WHERE id = ?", (tinker,))
            assert run_of(api, tinker)["source"] == "tinker-api"

        # The runs table: each run's source, the fork's parent, the sweep members' sweep.
        runs = open_route(page, live_server, "runs", "runs")
        table = runs.locator("table[data-testid=runs-table]")
        fork_row = table.locator(f'tr[data-run-id="{fork}"] td[data-col=source]')
        expect(fork_row.get_by_test_id("source-label")).to_have_text("API")
        expect(fork_row.get_by_test_id("fork-of")).to_have_text(f"fork of {parent} at step {at}")
        expect(fork_row.get_by_test_id("parent-link")).to_have_attribute("href", f"#/runs/{parent}")
        parent_row = table.locator(f'tr[data-run-id="{parent}"] td[data-col=source]')
        expect(parent_row.get_by_test_id("sweep-link")).to_have_attribute(
            "href", f"#/sweeps/{sweep.sweep_id}"
        )
        expect(parent_row.get_by_test_id("fork-of")).to_have_count(0)
        if tinker is not None:
            expect(
                table.locator(f'tr[data-run-id="{tinker}"] [data-testid=source-label]')
            ).to_have_text("Tinker SDK session")
        screenshot(page, "runs-sources")

        # Filtered by source.
        source_filter = runs.get_by_test_id("filter-source")
        source_filter.select_option("tinker-api")
        expect(table.locator(f'tr[data-run-id="{fork}"]')).to_have_count(0)
        if tinker is not None:
            expect(table.locator(f'tr[data-run-id="{tinker}"]')).to_be_visible()
        source_filter.select_option("api")
        expect(table.locator(f'tr[data-run-id="{fork}"]')).to_be_visible()
        expect(table.locator(f'tr[data-run-id="{other}"]')).to_have_count(0 if tinker else 1)
    finally:
        if run_of(api, fork)["status"] not in FINISHED:
            stop(api, fork)
