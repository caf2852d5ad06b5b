"""The dashboard on a server that takes a token: the first 401 opens the token dialog, the
token typed there is kept in the browser and sent as a bearer header, and the page works."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.browser.conftest import ConsoleErrors
from tests.support.live_server import LiveServer

expect = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed (the dev extra)"
).expect

if TYPE_CHECKING:
    from playwright.sync_api import Page

TOKEN = "dashboard-token-0123456789"


def test_a_401_asks_for_the_token_and_the_page_then_works(
    page: Page, tmp_path: Path, console_errors: ConsoleErrors
) -> None:
    console_errors.allow("401")  # the page's first calls, before it has the token
    server = LiveServer(tmp_path / "var", RLCS_API_TOKEN=TOKEN).start(timeout=60)
    try:
        page.goto(f"{server.url}/#/runs")
        dialog = page.get_by_test_id("token-dialog")
        expect(dialog).to_be_visible()
        page.get_by_test_id("token-input").fill(TOKEN)
        page.get_by_test_id("token-save").click()
        expect(dialog).to_be_hidden()
        expect(page.get_by_test_id("filter-env").locator("option[value=arithmetic]")).to_have_count(
            1
        )
        assert page.evaluate("localStorage.getItem('rlcs-token')") == TOKEN
        # Kept in the browser: a reload needs no dialog.
        page.reload()
        expect(page.get_by_test_id("runs-table")).to_be_visible()
        expect(page.get_by_test_id("filter-env").locator("option[value=arithmetic]")).to_have_count(
            1
        )
        expect(dialog).to_be_hidden()
    finally:
        server.kill(signal.SIGTERM)  # no runs were started
