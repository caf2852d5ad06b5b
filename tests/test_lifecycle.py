"""The run state machine, every (from, to) pair against a table written out here, on a real
SQLite file and a real PostgreSQL: what is allowed moves and stamps its time, what is not
changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine

from core import lifecycle, schema
from core.db import make_engine, read_session, write_session
from core.models import Run, RunStatus

Q, ST, R, SP = "queued", "starting", "running", "stopping"
OK, FAIL, STOP = "succeeded", "failed", "stopped"
ORDER = [Q, ST, R, SP, OK, FAIL, STOP]
# Rows: from; columns: to, in ORDER. "x": allowed. "=": same status (allowed, changes fields).
# queued -> running/stopping: a Ray job waits queued until its runner records running.
TABLE = {
    Q: ["=", "x", "x", "x", " ", "x", "x"],
    ST: [" ", "=", "x", "x", "x", "x", "x"],
    R: [" ", " ", "=", "x", "x", "x", "x"],
    SP: [" ", " ", " ", "=", "x", "x", "x"],
    OK: [" ", " ", " ", " ", "=", " ", " "],
    FAIL: [" ", " ", " ", " ", " ", "=", " "],
    STOP: [" ", " ", " ", " ", " ", " ", "="],
}
PAIRS = [(a, b, TABLE[a][i]) for a in ORDER for i, b in enumerate(ORDER)]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('lifecycle') / 'runs.db'}"
    else:
        url = request.getfixturevalue("postgres").new_database()
    engine = make_engine(url)
    schema.upgrade(engine)
    yield engine
    engine.dispose()  # before the session's PostgreSQL stops


def new_run(engine: Engine, run_id: str, status: str) -> None:
    with write_session(engine) as session:
        row = Run(id=run_id, environment="e", config_json="{}", config_hash="h", run_dir="/x")
        row.status = RunStatus(status)
        session.add(row)


def test_the_table_covers_every_status() -> None:
    assert sorted(ORDER) == sorted(s.value for s in RunStatus)


@pytest.mark.parametrize(("old", "new", "mark"), PAIRS, ids=[f"{a}->{b}" for a, b, _ in PAIRS])
def test_transition(engine: Engine, old: str, new: str, mark: str) -> None:
    run_id = f"r-t{ORDER.index(old)}{ORDER.index(new)}"
    new_run(engine, run_id, old)
    moved = lifecycle.set_status(engine, run_id, RunStatus(new), details="why")
    with read_session(engine) as session:
        run = session.get(Run, run_id)
    assert run is not None
    assert moved == (mark != " ")
    if mark == " ":
        assert run.status == old and run.details is None  # refused: nothing changed
        return
    assert run.status == new and run.details == "why"
    if mark == "x":
        assert (run.finished_at is not None) == (new in (OK, FAIL, STOP))
        assert (run.stop_requested_at is not None) == (new == SP)
        assert (run.started_at is not None) == (new == R)


@pytest.mark.parametrize("old", ORDER)
def test_only_a_finished_run_reopens_as_a_new_attempt(engine: Engine, old: str) -> None:
    run_id = f"r-re{ORDER.index(old)}"
    new_run(engine, run_id, old)
    lifecycle.record_fields(engine, run_id, pid=123, details="before")
    with write_session(engine) as session:
        run = session.get(Run, run_id)
        assert run is not None
        reopened = lifecycle.reopen(session, run)
    with read_session(engine) as session:
        run = session.get(Run, run_id)
    assert run is not None
    assert reopened == (old in (OK, FAIL, STOP))
    if reopened:
        assert (run.status, run.attempt, run.pid, run.details) == (Q, 2, None, None)
    else:
        assert (run.status, run.attempt, run.pid) == (old, 1, 123)


def test_a_missing_run_is_not_moved(engine: Engine) -> None:
    assert lifecycle.set_status(engine, "r-nosuch00", RunStatus.running) is False
