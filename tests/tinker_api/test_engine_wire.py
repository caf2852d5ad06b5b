"""The engine host on its own, spoken to over its socket as its clients speak to it (the models
of core.engine_wire): a hello answered by a welcome, then each Tinker request acknowledged
before its answer; an operation it does not know and a body that is not the SDK's protobuf
refused by their ids; a client of another wire version turned away by name; what a client made
released when it goes; one host per var/ folder, its socket its user's alone."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from core import engine_host
from core.engine_client import EngineClient
from core.engine_wire import FROM_HOST, WIRE, Hello, TinkerCall, TinkerReply, Turned
from core.line_socket import LineSocket
from core.settings import PROJECT_ROOT, Settings
from core.tinker_wire import (
    Accepted,
    CreateModel,
    Done,
    ForwardBackward,
    LoraSpec,
    Refused,
    Release,
    Released,
)
from tests.support.helpers import wait_for
from tests.support.settings import make_settings

pytestmark = pytest.mark.timeout(180)
WAIT_S = 60.0


class Unheard(BaseModel):
    """A Tinker call of an operation a newer client might send (not in this tree's union)."""

    kind: Literal["tinker"] = "tinker"
    request: dict[str, object]


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    settings = make_settings(tmp_path)
    yield settings
    engine_host.stop(settings.var_dir)


def raw(record: engine_host.HostRecord) -> LineSocket:
    return LineSocket.connect(Path(record.socket), FROM_HOST, "test")


def test_requests_are_acknowledged_then_answered_and_strangers_refused(settings: Settings) -> None:
    record = engine_host.ensure(settings)
    channel = raw(record)
    assert channel.send(Hello(wire=WIRE, client="test", role="tool", pid=os.getpid()))
    assert channel.read_one(WAIT_S).kind == "welcome"  # type: ignore[union-attr]

    def reply() -> object:
        message = channel.read_one(WAIT_S)
        assert isinstance(message, TinkerReply)
        return message.reply

    channel.send(TinkerCall(request=Release(id=1, models=["r-00000000:train:0"], samplers=[])))
    assert reply() == Accepted(id=1)
    done = reply()
    assert isinstance(done, Done) and done.id == 1 and done.answer == Released(held=[])

    channel.send(Unheard(request={"op": "unheard_of", "id": 2}))
    refused = reply()
    assert isinstance(refused, Refused) and (refused.id, refused.status) == (2, 400)
    assert "unheard_of" in refused.detail

    body = ForwardBackward(id=3, model_id="r-00000000:train:0", body=b"\xff\x01")
    channel.send(TinkerCall(request=body))
    refused = reply()
    assert isinstance(refused, Refused) and (refused.id, refused.status) == (3, 400)
    assert "ForwardBackwardRequest" in refused.detail
    channel.close()


def test_another_wire_is_turned_away_by_name(settings: Settings) -> None:
    record = engine_host.ensure(settings)
    channel = raw(record)
    channel.send(Hello(wire=WIRE + 1, client="run r-1", role="run", pid=os.getpid()))
    turned = channel.read_one(WAIT_S)
    assert isinstance(turned, Turned) and f"speaks wire {WIRE}" in turned.detail
    assert f"{WIRE + 1}" in turned.detail
    assert channel.read_one(WAIT_S) is None  # then it closes


def test_a_client_that_goes_loses_what_it_made(settings: Settings) -> None:
    client = EngineClient(settings, "run r-00000001", "run").start()
    replies: list[object] = []
    client.start(on_tinker=replies.append)
    lora = LoraSpec(rank=4, seed=1)
    client.send_tinker(
        CreateModel(
            id=1,
            model_id="r-00000001:train:0",
            base_model="tiny-random",
            lora=lora,
            checkpoint_dir=str(settings.var_dir / "ck"),
        )
    )
    wait_for(lambda: any(isinstance(r, Done) for r in replies), WAIT_S)
    observer = EngineClient(settings, "tool", "tool").start()
    (seen,) = [c for c in observer.status().clients if c.client == "run r-00000001"]
    assert (seen.models, seen.role, seen.pid) == (1, "run", os.getpid())
    assert [b.name for b in observer.status().bases] == ["tiny-random"]
    client.close()
    wait_for(lambda: observer.status().bases == [], WAIT_S)  # its model, and the base, freed
    assert [c.client for c in observer.status().clients] == ["tool"]
    observer.close()


def test_one_host_per_folder_and_its_socket_is_its_users_alone(settings: Settings) -> None:
    record = engine_host.ensure(settings)
    assert engine_host.ensure(settings) == record  # found, not started again
    second = subprocess.run(
        [sys.executable, "-m", settings.engine_host_module],
        cwd=PROJECT_ROOT,
        env=settings.child_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 0 and "another engine host holds" in second.stderr
    assert engine_host.running(settings.var_dir) == record
    mode = os.stat(record.socket).st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(os.stat(Path(record.socket).parent).st_mode) == 0o700
