"""The database engine (SQLite file in WAL mode by default; any SQLAlchemy URL works).

Writers open transactions with BEGIN IMMEDIATE so concurrent writers queue on the busy
timeout instead of failing with "database is locked" when a read lock cannot be upgraded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel, create_engine

BUSY_TIMEOUT_S = 30.0


def make_engine(url: str, busy_timeout_s: float = BUSY_TIMEOUT_S) -> Engine:
    """Create the engine; for SQLite set WAL, busy timeout and foreign keys on every connection.

    A writer waits up to `busy_timeout_s` for another's lock; past it SQLite raises
    OperationalError ("database is locked"), which the API answers with 503 and a retry hint."""
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
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
    def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        # Take over transaction control from pysqlite so BEGIN can be IMMEDIATE for writers.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def init_db(engine: Engine) -> None:
    from core import models  # noqa: F401  (registers the tables)

    SQLModel.metadata.create_all(engine)
    # create_all skips tables that exist, and with them indexes added since: add those.
    for table in SQLModel.metadata.sorted_tables:
        for index in table.indexes:
            index.create(engine, checkfirst=True)


@contextmanager
def read_session(engine: Engine) -> Iterator[Session]:
    with Session(engine) as session:
        yield session


@contextmanager
def write_session(engine: Engine) -> Iterator[Session]:
    """A session whose transaction takes the write lock up front, committed on success."""
    with Session(engine.execution_options(sqlite_begin="IMMEDIATE")) as session:
        yield session
        session.commit()
