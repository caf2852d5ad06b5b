"""tests/support/postgres.py: a real server that serves SQLAlchemy, isolates databases, ends
cleanly."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.postgres import PostgresServer, child_pids, postgres_or_skip

psycopg = pytest.importorskip("psycopg", reason="needs the `postgres` extra")


@contextmanager
def engine_for(url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()  # closes pooled connections, so no ResourceWarning and no held backends


def start_time(pid: int) -> str | None:
    """When `pid` started (tells it from a later process given the same pid); None once ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # fields 3.. of stat: state, ppid, ...
    # A zombie has ended; only its exit status waits for whoever reaps it (init, for the
    # children of a killed postmaster).
    return None if fields[0] == "Z" else fields[19]


def server_processes(server: PostgresServer) -> dict[int, str]:
    """The postmaster and its children, each with its start time."""
    assert server.proc is not None
    pids = [server.proc.pid, *child_pids(server.proc.pid)]
    return {pid: started for pid in pids if (started := start_time(pid)) is not None}


def assert_all_ended(processes: dict[int, str]) -> None:
    left = [pid for pid, started in processes.items() if start_time(pid) == started]
    assert not left, f"postgres processes still running after stop(): {left}"


def test_round_trip_through_sqlalchemy(postgres: PostgresServer, postgres_url: str) -> None:
    with engine_for(postgres_url) as engine, engine.begin() as conn:
        version = conn.execute(sa.text("SELECT version()")).scalar_one()
        assert version.startswith("PostgreSQL 15"), version
        conn.execute(sa.text("CREATE TABLE items (id serial PRIMARY KEY, name text NOT NULL)"))
        conn.execute(sa.text("INSERT INTO items (name) VALUES (:a), (:b)"), {"a": "x", "b": "y"})
        rows = conn.execute(sa.text("SELECT id, name FROM items ORDER BY id")).all()
        assert [tuple(row) for row in rows] == [(1, "x"), (2, "y")]

    # The session's own database is there too, under the documented URL.
    assert postgres.url == f"postgresql+psycopg://postgres@127.0.0.1:{postgres.port}/rlcs"
    with engine_for(postgres.url) as engine, engine.connect() as conn:
        assert conn.execute(sa.text("SELECT current_database()")).scalar_one() == "rlcs"


def test_new_databases_are_distinct_and_isolated(postgres: PostgresServer) -> None:
    first, second = postgres.new_database(), postgres.new_database()
    assert first != second
    with engine_for(first) as one, engine_for(second) as two:
        with one.begin() as conn:
            conn.execute(sa.text("CREATE TABLE only_here (x int)"))
            conn.execute(sa.text("INSERT INTO only_here VALUES (1)"))
        assert sa.inspect(one).get_table_names() == ["only_here"]
        assert sa.inspect(two).get_table_names() == []  # fresh and empty

    named = postgres.new_database("named_db")
    assert named.endswith(f":{postgres.port}/named_db")


def test_advisory_lock_is_held_by_one_connection_at_a_time(postgres_url: str) -> None:
    key = {"key": 4242}
    try_lock = sa.text("SELECT pg_try_advisory_lock(:key)")
    with engine_for(postgres_url) as engine, engine.connect() as a, engine.connect() as b:
        assert a.execute(try_lock, key).scalar_one() is True
        assert b.execute(try_lock, key).scalar_one() is False
        assert a.execute(sa.text("SELECT pg_advisory_unlock(:key)"), key).scalar_one() is True
        assert b.execute(try_lock, key).scalar_one() is True
        assert a.execute(try_lock, key).scalar_one() is False


def test_stop_leaves_no_process_and_no_folder() -> None:
    with postgres_or_skip() as server:
        root = server.root
        assert root is not None and root.is_dir()
        # An open client connection adds a backend that stop() must end as well.
        client = psycopg.connect(host="127.0.0.1", port=server.port, user="postgres", dbname="rlcs")
        try:
            client.execute("SELECT 1")
            processes = server_processes(server)
            # postmaster, checkpointer, background writer, walwriter, ..., and our backend
            assert len(processes) >= 5, processes
            server.stop()
            assert_all_ended(processes)
        finally:
            client.close()
    assert not root.exists()
    server.stop()  # a second stop is harmless


def test_stop_kills_a_server_that_does_not_shut_down() -> None:
    server = postgres_or_skip()
    try:
        processes = server_processes(server)
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)  # a frozen postmaster ignores fast shutdown
    finally:
        server.stop(timeout=1.0)
    assert_all_ended(processes)
