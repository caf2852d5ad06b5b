"""The Tinker worker process on its own, spoken to as the server speaks to it (core.child, the
models of core.tinker_wire): ready, then each request acknowledged before its answer; an
operation it does not know, and a body that is not the SDK's protobuf, refused by their ids;
the end of its input ends it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from core.child import Child
from core.settings import PROJECT_ROOT
from core.tinker_wire import (
    REPLY,
    Accepted,
    Done,
    ForwardBackward,
    Op,
    Ready,
    Refused,
    Release,
    Released,
    Reply,
    StateLoaded,
)
from tests.support.settings import make_settings

pytestmark = pytest.mark.timeout(180)
WAIT_S = 60.0


class Unheard(Op[StateLoaded]):
    """An operation a newer server might send."""

    op: Literal["unheard_of"] = "unheard_of"


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Child[Reply]]:
    settings = make_settings(tmp_path)
    child: Child[Reply] = Child(
        "the Tinker worker",
        [sys.executable, "-m", "runners.tinker_worker"],
        REPLY,
        cwd=PROJECT_ROOT,
        env=settings.child_environment(),
        log_path=tmp_path / "tinker-worker.log",
    )
    yield child
    child.kill()


def test_requests_are_acknowledged_then_answered_and_strangers_refused(
    worker: Child[Reply],
) -> None:
    assert isinstance(worker.receive(WAIT_S), Ready)

    assert worker.send(Release(id=1, models=["r-00000000:train:0"], samplers=[]))
    assert worker.receive(WAIT_S) == Accepted(id=1)
    done = worker.receive(WAIT_S)
    assert isinstance(done, Done) and done.id == 1
    assert done.answer == Released(held=[])

    assert worker.send(Unheard(id=2))
    refused = worker.receive(WAIT_S)
    assert isinstance(refused, Refused) and (refused.id, refused.status) == (2, 400)
    assert "unheard_of" in refused.detail

    assert worker.send(ForwardBackward(id=3, model_id="r-00000000:train:0", body=b"\xff\x01"))
    refused = worker.receive(WAIT_S)
    assert isinstance(refused, Refused) and (refused.id, refused.status) == (3, 400)
    assert "ForwardBackwardRequest" in refused.detail

    worker.stop()  # its input closed: it ends at once, with nothing left over
    assert worker.exit_status() == "exit code 0"
