"""Inference work has an owner: the worker stops decoding when a request's client goes away or
its deadline passes, and exits within seconds of its server's death, however the server died.
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

from core.procs import process_start_time, same_process_alive
from tests.support.helpers import processes_with, wait_for
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
    """Answer one short request (loading the model), then return the worker's pid and start."""
    httpx.post(f"{server.url}/environments/repeat_word/select", timeout=10).raise_for_status()
    answer = httpx.post(
        f"{server.url}/test/inference", json={"prompts": ["Hi"], "max_tokens": 1}, timeout=300
    )
    assert answer.status_code == 200, answer.text
    assert server.proc is not None
    pid = worker_of(server.proc.pid)
    return pid, process_start_time(pid)


def worker_of(server_pid: int) -> int:
    workers = processes_with("runners.infer", parent=server_pid)
    assert workers, "no inference worker under the server"
    return workers[0]


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def busy_share(pid: int, window_s: float = 0.5) -> float:
    """Share of one core the process used over `window_s`."""
    before = cpu_ticks(pid)
    time.sleep(window_s)
    return (cpu_ticks(pid) - before) / TICKS_PER_S / window_s


def post_in_background(server: LiveServer, body: dict, timeout: float) -> threading.Thread:
    def send() -> None:
        try:
            httpx.post(f"{server.url}/test/inference", json=body, timeout=timeout)
        except httpx.HTTPError:
            pass  # the server died or the client gave up: what the test is about

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_worker_dies_with_its_server(serve, sig: signal.Signals) -> None:
    server = serve()
    pid, start = warm_worker(server)
    post_in_background(server, LONG, timeout=120)
    wait_for(lambda: busy_share(pid) > 0.3, 30)  # decoding the long request
    assert server.proc is not None
    server.proc.send_signal(sig)
    server.proc.wait(timeout=10)  # SIGTERM: the bounded graceful wait, not the 24-s budget
    wait_for(lambda: not same_process_alive(pid, start), 5)


def test_a_request_whose_client_left_is_cancelled(serve) -> None:
    server = serve(RLCS_INFERENCE_BUDGET_S="60", RLCS_INFERENCE_TIMEOUT_S="120")
    pid, start = warm_worker(server)
    client = post_in_background(server, LONG, timeout=3)  # gives up after 3 s
    wait_for(lambda: busy_share(pid) > 0.3, 30)
    client.join(10)
    gave_up = time.monotonic()
    wait_for(lambda: busy_share(pid) < 0.1, 10)
    assert time.monotonic() - gave_up < 3.0  # stopped at a decode step, not at the budget
    # The same worker (not a restarted one) answers the next request at once.
    answer = httpx.post(
        f"{server.url}/test/inference", json={"prompts": ["Hi"], "max_tokens": 2}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    assert same_process_alive(pid, start) and worker_of(server.proc.pid) == pid


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
