"""Inference work has an owner: the engine host stops decoding a request when its client goes
away or its deadline passes, and stops the server's requests within seconds of its death,
however the server died (the host itself goes on: runs use it; the next server adopts it).
SmolLM2 on the CPU decodes slowly enough that a 4,000-token request is still running when
the test acts."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core import engine_host
from core.procs import process_start_time, same_process_alive
from tests.support.helpers import wait_for
from tests.support.live_server import LiveServer

LONG = {"prompts": ["Tell me a very long story about a river."], "max_tokens": 4000}
TICKS_PER_S = 100  # USER_HZ on Linux


@pytest.fixture
def serve(tmp_path: Path, prepared_models_dir: Path) -> Iterator[callable]:
    """Servers on the SmolLM2 the set-up converted (converting is not what these tests are
    about), each in a var folder of its own."""
    started: list[LiveServer] = []

    def start(**env: str) -> LiveServer:
        models = str(prepared_models_dir)
        settings = {"RLCS_INFERENCE_WARMUP": "0", "RLCS_MODELS_DIR": models, **env}
        server = LiveServer(tmp_path / f"var{len(started)}", **settings).start(timeout=60)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill(signal.SIGKILL)


def warm_worker(server: LiveServer) -> tuple[int, float | None]:
    """Answer one short request (loading the model), then return the host's pid and start."""
    httpx.post(f"{server.url}/environments/repeat_word/select", timeout=10).raise_for_status()
    answer = httpx.post(
        f"{server.url}/test/inference", json={"prompts": ["Hi"], "max_tokens": 1}, timeout=300
    )
    assert answer.status_code == 200, answer.text
    pid = worker_of(server)
    return pid, process_start_time(pid)


def worker_of(server: LiveServer) -> int:
    record = engine_host.running(server.var_dir)
    assert record is not None, "no engine host for the server's var folder"
    return record.pid


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def busy_share(pid: int, window_s: float = 0.5) -> float:
    """Share of one core the process used over `window_s`."""
    before = cpu_ticks(pid)
    time.sleep(window_s)
    return (cpu_ticks(pid) - before) / TICKS_PER_S / window_s


class Background(threading.Thread):
    """A /test/inference request sent from a thread; `outcome`: how it ended (a status and
    the start of its text, or the error)."""

    def __init__(self, server: LiveServer, body: dict, timeout: float) -> None:
        super().__init__(daemon=True)
        self.url, self.body, self.timeout = f"{server.url}/test/inference", body, timeout
        self.outcome = "still waiting"

    def run(self) -> None:
        try:
            answer = httpx.post(self.url, json=self.body, timeout=self.timeout)
            self.outcome = f"{answer.status_code} {answer.text[:300]}"
        except httpx.HTTPError as exc:
            self.outcome = repr(exc)  # the server died or the client gave up: what's tested


def post_in_background(server: LiveServer, body: dict, timeout: float) -> Background:
    thread = Background(server, body, timeout)
    thread.start()
    return thread


def wait_decoding(pid: int, request: Background) -> None:
    """Until the host decodes `request` (a request answered first fails, saying how)."""

    def decoding() -> bool:
        assert request.is_alive(), f"the request ended before it was decoded: {request.outcome}"
        return busy_share(pid) > 0.3

    wait_for(decoding, 60)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_servers_requests_stop_with_it_and_the_host_is_adopted(
    serve, sig: signal.Signals
) -> None:
    server = serve()
    pid, start = warm_worker(server)
    wait_decoding(pid, post_in_background(server, LONG, timeout=120))
    server.kill(sig, engine=False)  # SIGTERM: the bounded graceful wait, not the 24-s budget
    wait_for(lambda: busy_share(pid) < 0.1, 10)  # its connection gone: its request stopped
    assert same_process_alive(pid, start)  # the host goes on (runs would be using it)
    again = LiveServer(server.var_dir, **server.env_overrides).start(timeout=60)
    try:
        answer = httpx.post(
            f"{again.url}/test/inference", json={"prompts": ["Hi"], "max_tokens": 2}, timeout=60
        )
        assert answer.status_code == 200, answer.text
        assert worker_of(again) == pid  # adopted, not started anew
    finally:
        again.kill(signal.SIGKILL)


def test_a_request_whose_client_left_is_cancelled(serve) -> None:
    server = serve(RLCS_INFERENCE_BUDGET_S="60", RLCS_INFERENCE_TIMEOUT_S="120")
    pid, start = warm_worker(server)
    client = post_in_background(server, LONG, timeout=3)  # gives up after 3 s
    wait_decoding(pid, client)
    client.join(10)
    gave_up = time.monotonic()
    wait_for(lambda: busy_share(pid) < 0.1, 10)
    assert time.monotonic() - gave_up < 3.0  # stopped at a decode step, not at the budget
    # The same worker (not a restarted one) answers the next request at once.
    answer = httpx.post(
        f"{server.url}/test/inference", json={"prompts": ["Hi"], "max_tokens": 2}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    assert same_process_alive(pid, start) and worker_of(server) == pid


def test_a_request_past_its_deadline_leaves_the_worker_idle(serve) -> None:
    server = serve(RLCS_INFERENCE_BUDGET_S="3")
    pid, _ = warm_worker(server)
    started = time.monotonic()
    # Eight long stories: one sampled story may end within the budget, not all eight.
    eight = {**LONG, "prompts": LONG["prompts"] * 8}
    answer = httpx.post(f"{server.url}/test/inference", json=eight, timeout=60)
    took = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert any(r["truncated"] and "time budget" in r["reason"] for r in results), results
    assert took < 8
    assert busy_share(pid, 1.0) < 0.1  # idle within a second of the answer
