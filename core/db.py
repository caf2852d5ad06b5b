"""The database engine: a SQLite file in WAL mode by default, or PostgreSQL (psycopg 3).

Writers queue one behind another, as a single writer at a time keeps read-modify-write
transitions simple: on SQLite by BEGIN IMMEDIATE (not failing with "database is locked" when
a read lock cannot be upgraded), on PostgreSQL by a transaction-scoped advisory lock. Either
waits up to the busy timeout, then raises OperationalError (the API's 503).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import ConnectionPoolEntry
from sqlmodel import Session, create_engine

BUSY_TIMEOUT_S = 30.0
WRITER = {"rlcs_writer": True}  # execution options of a writing transaction
WRITE_LOCK = 0x524C4353_0002  # PostgreSQL advisory-lock key of the writers' queue


def make_engine(url: str, busy_timeout_s: float = BUSY_TIMEOUT_S) -> Engine:
    """Create the engine; for SQLite set WAL, busy timeout and foreign keys on every connection.

    A writer waits up to `busy_timeout_s` for another's lock; past it SQLite raises
    OperationalError ("database is locked"), which the API answers with 503 and a retry hint."""
    if not url.startswith("sqlite"):
        return _server_engine(url, busy_timeout_s)
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": busy_timeout_s},
        pool_size=20,
        max_overflow=20,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
        # Take over transaction control from pysqlite so BEGIN can be IMMEDIATE for writers.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        writer = conn.get_execution_options().get("rlcs_writer", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writer else "BEGIN DEFERRED")

    return engine


def _server_engine(url: str, busy_timeout_s: float) -> Engine:
    engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    if engine.dialect.name != "postgresql":
        return engine

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get("rlcs_writer", False):
            # Past the busy timeout the wait ends in an error (LockNotAvailable), not forever.
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = {int(busy_timeout_s * 1000)}")
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITE_LOCK})")

    return engine


@contextmanager
def read_session(engine: Engine) -> Iterator[Session]:
    with Session(engine) as session:
        yield session


@contextmanager
def write_session(engine: Engine) -> Iterator[Session]:
    """A session whose transaction takes the write lock up front, committed on success."""
    with Session(engine.execution_options(**WRITER)) as session:
        yield session
        session.commit()
