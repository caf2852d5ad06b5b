"""Fixtures for the dashboard's end-to-end tests: Debian's chromium (installed with apt-get
when missing), driven headless by Playwright, against a live server (tests/support/live_server.py).

Every page records the browser's console errors and uncaught page errors; a test fails at
teardown if any it did not expect were seen. A failed test leaves a full-page screenshot and
the page's HTML under test-artifacts/failures/."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from core.settings import PROJECT_ROOT
from tests.support.helpers import (
    FINISHED,
    pid_alive,
    proc_cmdline,
    proc_stat,
    processes_with,
    wait_for,
)
from tests.support.live_server import LiveServer

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Playwright

ARTIFACTS = PROJECT_ROOT / "test-artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
FAILURES = ARTIFACTS / "failures"
# Debian's package; Playwright's own browser download is not used (nor reachable everywhere).
CHROMIUM_PACKAGE = "chromium"
INSTALL_BUDGET_S = 420.0  # apt-get install, and apt-get update plus a second try if needed
VIEWPORT = {"width": 1400, "height": 900}


# --- chromium and Playwright -------------------------------------------------------------


def _apt_get(args: list[str], deadline: float) -> tuple[bool, str]:
    """Run `apt-get <args>` within what is left of the install budget: (ok, output tail)."""
    left = deadline - time.monotonic()
    if left <= 5:
        return False, "no time left in the install budget"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run(
            ["apt-get", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=left,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return False, f"`apt-get {' '.join(args)}` timed out after {left:.0f}s"
    tail = (done.stdout + done.stderr).strip()[-1500:]
    return done.returncode == 0, tail


def ensure_chromium() -> tuple[str | None, str]:
    """The path of a chromium executable, installing Debian's package when there is none;
    (None, why) where it cannot be had."""
    found = shutil.which("chromium")
    if found:
        return found, "already installed"
    if shutil.which("apt-get") is None:
        return None, "chromium is not installed and there is no apt-get to install it with"
    if os.geteuid() != 0:
        return None, (
            "chromium is not installed and installing it needs root "
            "(run `apt-get install -y --no-install-recommends chromium` as root)"
        )
    started = time.monotonic()
    deadline = started + INSTALL_BUDGET_S
    install = ["install", "-y", "--no-install-recommends", CHROMIUM_PACKAGE]
    ok, out = _apt_get(install, deadline)
    if not ok:  # stale package lists: refresh them once and try again
        updated, update_out = _apt_get(["update"], deadline)
        if not updated:
            return None, (
                f"`apt-get install chromium` failed ({out}); `apt-get update` failed too "
                f"({update_out})"
            )
        ok, out = _apt_get(install, deadline)
    if not ok:
        return None, f"`apt-get install chromium` failed after `apt-get update`: {out}"
    found = shutil.which("chromium")
    if not found:
        return None, "`apt-get install chromium` succeeded but no `chromium` is on PATH"
    return found, f"installed with apt-get in {time.monotonic() - started:.0f}s"


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path, how = ensure_chromium()
    if path is None:
        pytest.skip(f"no chromium for the browser tests: {how}")
    print(f"chromium: {path} ({how})")
    return path


# Package scope, not session: Playwright's sync API keeps an event loop running in the main
# thread while it is open, and tests elsewhere that call asyncio.run() would find it.
@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.skip(
            f"the playwright package is not importable ({exc}); "
            "`pip install -e '.[dev]'` installs it"
        )
    with sync_playwright() as pw:
        yield pw
    # Playwright's driver (a node process of this one) went with it.
    wait_for(lambda: not processes_with("run-driver", parent=os.getpid()), timeout=20, every=0.1)


def chromium_processes() -> set[int]:
    """What `pgrep -f chromium` lists, less zombies (the machine's init reaps those in its own
    time): live processes with chromium in their command line."""
    return set(processes_with("chromium"))


def browser_processes(browser_pid: int, also: set[int]) -> set[int]:
    """The live processes of one browser: its session (Playwright starts the browser as a
    session leader; zygotes, renderers, GPU and utility processes stay in it), and `also`
    (the crash handlers it started, which leave it) while they live. Other test runs'
    browsers on the same machine are not counted."""
    session = {p for p in chromium_processes() if proc_stat(p)[3:4] == [str(browser_pid)]}
    return session | {p for p in also if pid_alive(p)}


@pytest.fixture(scope="package")
def browser(playwright: Playwright, chromium_path: str) -> Iterator[Browser]:
    from playwright.sync_api import expect

    expect.set_options(timeout=30_000)
    before = chromium_processes()
    browser = playwright.chromium.launch(
        executable_path=chromium_path, args=["--no-sandbox"], headless=True
    )
    started = chromium_processes() - before
    drivers = {str(pid) for pid in processes_with("run-driver", parent=os.getpid())}
    roots = [p for p in started if proc_stat(p)[1:2] and proc_stat(p)[1] in drivers]
    assert len(roots) == 1, f"cannot tell which chromium process is this browser: {roots}"
    handlers = {p for p in started if "chrome_crashpad_handler" in proc_cmdline(p)}
    try:
        yield browser
    finally:
        browser.close()
        # Every process this browser started is gone (the browser, its zygotes, renderers).
        left: set[int] = set()

        def all_gone() -> bool:
            left.clear()
            left.update(browser_processes(roots[0], handlers))
            return not left

        try:
            wait_for(all_gone, timeout=20, every=0.1)
        except AssertionError:
            raise AssertionError(
                "chromium processes left after the browser closed: "
                + "; ".join(f"{pid} {proc_cmdline(pid)[:120]}" for pid in sorted(left))
            ) from None


# --- pages, console errors and artefacts ---------------------------------------------------


@dataclass
class ConsoleErrors:
    """The page's console errors and uncaught exceptions; a test may `allow` console errors
    it provokes on purpose (a refused request, a lost server). Page errors are never allowed."""

    console: list[str] = field(default_factory=list)
    page: list[str] = field(default_factory=list)
    allowed: list[re.Pattern[str]] = field(default_factory=list)

    def allow(self, pattern: str) -> None:
        self.allowed.append(re.compile(pattern))

    def unexpected(self) -> list[str]:
        console = [m for m in self.console if not any(p.search(m) for p in self.allowed)]
        return console + self.page


@pytest.fixture
def console_errors() -> ConsoleErrors:
    return ConsoleErrors()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Iterator[None | pytest.TestReport]:
    """Keeps each phase's report on the test, for `page` to know whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def page(
    browser: Browser, console_errors: ConsoleErrors, request: pytest.FixtureRequest
) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()

    def on_console(msg: Any) -> None:
        if msg.type == "error":
            where = msg.location or {}
            at = f" ({where['url']}:{where.get('lineNumber')})" if where.get("url") else ""
            console_errors.console.append(f"{msg.text}{at}")

    def on_page_error(exc: Any) -> None:
        console_errors.page.append(f"uncaught: {exc} {getattr(exc, 'stack', '') or ''}".strip())

    page.on("console", on_console)
    page.on("pageerror", on_page_error)
    try:
        yield page
    finally:
        call = getattr(request.node, "report_call", None)
        if call is not None and call.failed:
            save_failure(page, request.node.name)
        context.close()
    unexpected = console_errors.unexpected()
    assert not unexpected, "errors in the browser console:\n" + "\n".join(unexpected)


def save_failure(page: Page, name: str) -> None:
    """A failed test's last view: full-page screenshot and HTML (what the DOM held)."""
    FAILURES.mkdir(parents=True, exist_ok=True)
    try:
        page.screenshot(path=str(FAILURES / f"{name}.png"), full_page=True)
        (FAILURES / f"{name}.html").write_text(page.content(), encoding="utf-8")
    except Exception as exc:  # the page may be gone; the test's own failure says more
        print(f"could not save the failed page of {name}: {exc}")


def screenshot(page: Page, name: str) -> Path:
    """A full-page screenshot kept as a test artefact: test-artifacts/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    # From the top: a sticky header would otherwise be drawn where the page was scrolled to.
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)
    return path


# --- live servers --------------------------------------------------------------------------


def stop_all_runs(server: LiveServer, timeout: float = 90.0) -> None:
    """Stop every run the server still has going and wait until each has ended."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        try:
            runs = http.get("/runs", params={"limit": 1000}).json()
        except httpx.HTTPError:
            return
        active = [r["run_id"] for r in runs if r["status"] not in FINISHED]
        for run_id in active:
            http.post(f"/runs/{run_id}/stop")
        for run_id in active:
            wait_for(
                lambda rid=run_id: http.get(f"/runs/{rid}").json()["status"] in FINISHED,
                timeout,
                every=0.2,
            )


def shut_down(server: LiveServer) -> None:
    """Stop the server's runs, then the server; SIGKILL whatever its runs left behind."""
    try:
        if server.proc is not None and server.proc.poll() is None:
            stop_all_runs(server)
    finally:
        server.kill(signal.SIGTERM)
        for pid in processes_with(server.var_dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One tokenless loopback server for the module, with its own var dir."""
    server = LiveServer(tmp_path_factory.mktemp("dashboard") / "var")
    server.start(timeout=60)
    try:
        yield server
    finally:
        shut_down(server)


@pytest.fixture(scope="module")
def api(live_server: LiveServer) -> Iterator[httpx.Client]:
    """The module server's REST API, to set up state and to check what the page did."""
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        yield http
