"""The engine host under faults (issue 43), with real processes and signals: runs training when
the host is killed resume by themselves from their last checkpoint and end with complete
histories; a killed run's models are released at once; a client gone silent is released after
its timeout; a killed server leaves its runs and host working, and the next server adopts them;
a run whose base the host's memory budget cannot take waits, saying why, then fails with it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from core import engine_host
from core.engine_slots import plan
from core.engine_wire import FROM_HOST, WIRE, Hello
from core.line_socket import LineSocket
from tests.support.helpers import TINY_RUN, finish_run, run_of, start_run, wait_for
from tests.support.live_server import LiveServer
from tests.support.settings import make_settings

pytestmark = pytest.mark.timeout(600)
RUN = {**TINY_RUN, "environment": "repeat_word", "save_every": 2, "steps_per_eval": 0}
STEPS = 150  # tiny-random's steps take a tenth of a second: long enough to kill the host mid-run


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with LiveServer(tmp_path / "var", RLCS_MAX_CONCURRENT_RUNS="4") as live:
        yield live


def steps_recorded(server: LiveServer, run_id: str) -> list[int]:
    rows = server.api.get(f"/runs/{run_id}/history").json()["rows"]
    return [row["step"] for row in rows if "time/step_s" in row]


def first_host(server: LiveServer) -> dict:
    """GET /engine's first host (the machine's one, where RLCS_ENGINE_HOSTS is unset)."""
    return server.api.get("/engine").json()["hosts"][0]


def host_pid(server: LiveServer) -> int:
    record = engine_host.running(server.var_dir)
    assert record is not None
    return record.pid


def test_runs_resume_by_themselves_when_the_host_is_killed(server: LiveServer) -> None:
    runs = [start_run(server.api, **RUN, total_steps=STEPS, seed=i) for i in range(3)]
    # Each has a checkpoint (step 2) and is on its way past it.
    wait_for(lambda: all(run_of(server.api, r)["step"] >= 3 for r in runs), 240, every=0.2)
    killed = host_pid(server)
    os.kill(killed, signal.SIGKILL)
    for run_id in runs:
        run = finish_run(server.api, run_id, timeout=300)
        assert run["status"] == "succeeded", run
        assert run["step"] == STEPS
        assert "resumed by itself" in (run["details"] or ""), run
        assert steps_recorded(server, run_id) == list(range(1, STEPS + 1))  # no gap, none twice
    assert host_pid(server) != killed  # a new host, started by the first run to need one


def test_a_killed_run_is_released_at_once(server: LiveServer) -> None:
    run_id = start_run(server.api, **RUN, total_steps=200)
    name = f"run {run_id}"

    def clients() -> list[dict]:
        return first_host(server)["clients"]

    wait_for(lambda: any(c["client"] == name and c["models"] for c in clients()), 120)
    assert run_of(server.api, run_id)["pid"]
    os.kill(run_of(server.api, run_id)["pid"], signal.SIGKILL)
    wait_for(lambda: all(c["client"] != name for c in clients()), 30)
    assert first_host(server)["bases"] == []  # its model (and base) freed


def test_a_client_gone_silent_is_released_after_its_timeout(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, engine_client_timeout_s=1.0)
    record = engine_host.ensure(settings)
    quiet = LineSocket.connect(Path(record.socket), FROM_HOST, "quiet")
    quiet.send(Hello(wire=WIRE, client="quiet", role="tool", pid=os.getpid()))
    assert quiet.read_one(30) is not None  # welcomed; then it says nothing (no beats)
    said = time.monotonic()
    assert quiet.read_one(30) is None  # the host closed it
    assert time.monotonic() - said < 10
    log = engine_host.log_path(settings.var_dir, plan(settings)[0]).read_text()
    assert "client quiet sent nothing" in log


def test_a_killed_server_leaves_runs_and_host_working_and_is_adopted(tmp_path: Path) -> None:
    var = tmp_path / "var"
    first = LiveServer(var).start()
    run_id = start_run(first.api, **RUN, total_steps=40)
    wait_for(lambda: run_of(first.api, run_id)["step"] >= 2, 120, every=0.2)
    pid = host_pid(first)
    first.kill(signal.SIGKILL, engine=False)
    # With no server, the run goes on in the host.
    step = _step_in_db(var, run_id)
    wait_for(lambda: _step_in_db(var, run_id) > step + 1, 120, every=0.2)
    second = LiveServer(var).start()
    try:
        engine = first_host(second)
        assert engine["pid"] == pid  # adopted, not started again
        assert any(c["client"] == f"run {run_id}" for c in engine["clients"])
        assert finish_run(second.api, run_id, timeout=300)["status"] == "succeeded"
        assert steps_recorded(second, run_id) == list(range(1, 41))
    finally:
        second.kill(signal.SIGTERM)


def _step_in_db(var: Path, run_id: str) -> int:
    from core.db import make_engine, read_session
    from core.models import Run

    engine = make_engine(f"sqlite:///{var / 'rlcs.db'}")
    try:
        with read_session(engine) as session:
            run = session.get(Run, run_id)
            return run.step if run is not None else 0
    finally:
        engine.dispose()


def test_engine_lists_the_host(server: LiveServer) -> None:
    assert server.api.get("/engine").json()["running"] is False  # a read starts nothing
    run_id = start_run(server.api, **RUN, total_steps=2)
    assert finish_run(server.api, run_id, timeout=120)["status"] == "succeeded"
    engine = server.api.get("/engine").json()
    (host,) = engine["hosts"]  # one on a machine without a GPU
    assert engine["running"] and host["running"] and host["pid"] == host_pid(server)
    assert host["device"] == "cpu" and host["name"] == f"{engine['node']}/0"
    assert host["log"].endswith("/0/host.log") and host["rss_bytes"] > 0
    environment = psutil.Process(host["pid"]).environ()  # what keeps its memory returning
    for name, value in engine_host.HOST_ENVIRONMENT.items():  # oneDNN's cache, glibc's malloc
        assert environment[name] == value
    assert httpx.get(f"{server.url}/engine").status_code == 200


def test_a_run_whose_base_the_budget_cannot_take_waits_saying_why_then_fails(
    tmp_path: Path,
) -> None:
    # Long enough a wait that the test sees it however loaded the machine (a 3-s wait was
    # over before a slow poll looked once).
    no_room = {"RLCS_ENGINE_MEMORY_BUDGET_GB": "0.00001", "RLCS_ENGINE_ADMISSION_WAIT_S": "15"}
    with LiveServer(tmp_path / "var", **no_room) as server:
        run_id = start_run(server.api, **RUN, total_steps=2)
        wait_for(lambda: "waiting for room" in (run_of(server.api, run_id)["details"] or ""), 120)
        details = run_of(server.api, run_id)["details"]
        assert "memory budget" in details and "loaded now" in details, details
        run = finish_run(server.api, run_id, timeout=120)
        assert run["status"] == "failed" and "memory budget" in run["error"], run
        assert engine_host.running(server.var_dir) is not None  # the host itself is fine
