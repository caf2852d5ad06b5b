"""How sessions end: closed by the script (succeeded, or failed when it raised), stopped
through our API (the script's next call says so), or settled when the script is killed
mid-step (its heartbeats stop: its models are freed, nothing of it runs on) or the engine host
dies under it; the quiet-session rule with an injected clock."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker

from core import engine_host
from core.models import RunStatus
from server.engine.hosts import EngineHosts
from server.tinker_api import schemas
from server.tinker_api.service import TinkerService
from tests.support.helpers import pid_alive, processes_with, wait_for
from tests.support.live_server import LiveServer
from tests.support.settings import make_settings
from tests.tinker_api.conftest import WAIT_S, sdk_env, tinker_server
from tests.tinker_api.reference import ADAM, datums

pytestmark = pytest.mark.timeout(240)
SCRIPT = Path(__file__).with_name("killed_script.py")


def run_of(server: LiveServer, run_id: str) -> dict:
    return server.api.get(f"/runs/{run_id}").json()


def log_lines(server: LiveServer, run_id: str) -> list[str]:
    return server.api.get(f"/runs/{run_id}/logs", params={"tail": 100}).json()["lines"]


def test_stopping_the_run_ends_the_session(server: LiveServer) -> None:
    service = tinker.ServiceClient()
    training = service.create_lora_training_client("tiny-random", rank=4, seed=1).result(WAIT_S)
    training.forward_backward(datums("cross_entropy"), "cross_entropy").result(WAIT_S)
    run_id = training.model_id.split(":")[0]

    assert server.api.post(f"/runs/{run_id}/stop").status_code == 200
    wait_for(lambda: run_of(server, run_id)["status"] == "stopped", timeout=20)
    with pytest.raises(tinker.BadRequestError, match="stopped through the control server"):
        training.forward_backward(datums("cross_entropy"), "cross_entropy").result(WAIT_S)
    assert "stopped on request" in run_of(server, run_id)["details"]
    wait_for(lambda: any("models freed" in line for line in log_lines(server, run_id)))


def test_a_script_that_raises_fails_its_run(server: LiveServer) -> None:
    with pytest.raises(RuntimeError), tinker.ServiceClient() as service:
        training = service.create_lora_training_client("tiny-random", rank=4).result(WAIT_S)
        run_id = training.model_id.split(":")[0]
        raise RuntimeError("the script's own bug")
    # The SDK's close waits for the server's answer, which comes once the end is recorded.
    run = run_of(server, run_id)
    assert (run["status"], run["failure_kind"]) == ("failed", "script")


@pytest.fixture(scope="module")
def fragile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of its own (its engine host gets killed), whose sessions go quiet after 2 s."""
    var = tmp_path_factory.mktemp("tinker-fragile")
    with tinker_server(var, RLCS_TINKER_SESSION_TIMEOUT_S="2") as live:
        yield live


def test_a_script_killed_mid_step_is_settled_and_freed(fragile: LiveServer) -> None:
    with subprocess.Popen(
        [sys.executable, str(SCRIPT)],
        env=sdk_env(fragile),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as script:
        assert script.stdout is not None
        line = script.stdout.readline()
        if script.poll() is None:
            script.send_signal(signal.SIGKILL)  # mid-step: its forward_backwards are queued
        _, errors = script.communicate(timeout=30)
    assert line.startswith("training "), errors[-3000:]
    run_id = line.split()[1].split(":")[0]
    run = wait_for(lambda: (r := run_of(fragile, run_id))["status"] != "running" and r, timeout=30)
    assert run["status"] == "failed", run
    assert run["failure_kind"] == "lost"
    assert "sent nothing" in run["details"]
    # Its queued steps never run; the model is freed once the running one ends.
    wait_for(lambda: any("models freed" in line for line in log_lines(fragile, run_id)), 60)
    assert not processes_with(str(SCRIPT))
    assert not pid_alive(script.pid)


@pytest.fixture
def killable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of its own whose engine host gets killed, with the default quiet timeout: at 2 s
    (`fragile`) the session, silent between the SDK's 10 s heartbeats, could be settled as quiet
    before the host's death reached it (seen in 2 of 4 runs)."""
    with tinker_server(tmp_path_factory.mktemp("tinker-killable")) as live:
        yield live


def test_sessions_of_a_dead_engine_host_are_settled(killable: LiveServer) -> None:
    service = tinker.ServiceClient(base_url=killable.url)
    training = service.create_lora_training_client("tiny-random", rank=4).result(WAIT_S)
    run_id = training.model_id.split(":")[0]
    host = engine_host.running(killable.var_dir)
    assert host is not None
    os.kill(host.pid, signal.SIGKILL)
    run = wait_for(lambda: (r := run_of(killable, run_id))["status"] == "failed" and r, 30)
    # The failure kind runs have recorded for it since the process was "the engine".
    assert run["failure_kind"] == "engine" and "exited" in run["details"]
    assert "Last lines of its log" in run["details"]
    with pytest.raises(tinker.BadRequestError, match="engine host exited"):
        training.optim_step(ADAM).result(WAIT_S)
    # A new session gets a new host.
    again = tinker.ServiceClient(base_url=killable.url)
    fresh = again.create_lora_training_client("tiny-random", rank=4).result(WAIT_S)
    assert fresh.forward(datums("cross_entropy"), "cross_entropy").result(WAIT_S)
    again.close("success").result(WAIT_S)


def test_a_quiet_session_is_settled_when_its_time_is_up(tmp_path: Path) -> None:
    """The rule alone, with an injected clock: heartbeats keep a session; silence ends it, as
    lost with requests unanswered, else as a script that ended without closing."""
    settings = make_settings(tmp_path, tinker_session_timeout_s=60.0)
    from core.db import make_engine
    from core.schema import upgrade

    engine = make_engine(settings.db_url)
    upgrade(engine)
    now = [1000.0]
    service = TinkerService(settings, engine, EngineHosts(settings), clock=lambda: now[0])

    async def scenario() -> tuple[str, str]:
        await service.start()
        new = schemas.CreateSessionIn(sdk_version="0.38.0")
        dying = (await service.create_session(new))["session_id"]
        ending = (await service.create_session(new))["session_id"]
        service.futures.new(dying, "train")  # a request it never had the answer of
        now[0] += 50
        service.heartbeat(dying)
        service.heartbeat(ending)
        now[0] += 50  # 100 s since they started, 50 since their heartbeats
        await service.sweep()
        assert service.holds(dying) and service.holds(ending)
        now[0] += 11
        await service.sweep()
        assert not service.holds(dying) and not service.holds(ending)
        await service.stop()
        return dying, ending

    dying, ending = asyncio.run(scenario())
    lost, ended = service.records.run(dying), service.records.run(ending)
    assert lost is not None and ended is not None
    assert (lost.status, lost.failure_kind) == (RunStatus.failed, "lost")
    assert "61 s" in (lost.details or "") and "1 request(s) unanswered" in (lost.details or "")
    assert ended.status == RunStatus.succeeded
    assert "ended without closing its session" in (ended.details or "")
    engine.dispose()
