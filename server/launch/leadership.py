"""Which server supervises the runs of a database: one at a time. On PostgreSQL a session
advisory lock held on a connection of its own (the database drops it when that server dies);
on SQLite an exclusive lock on a file beside the database. The others serve every route and
stand by, trying again every few seconds."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger(__name__)
SUPERVISOR_LOCK = 0x524C4353_0003  # PostgreSQL advisory-lock key of the supervisor


class Leadership:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None  # PostgreSQL: the session holding the lock
        self._file: Any = None  # SQLite: the open, flock-ed lock file
        self.held = False
        self.reason = "not tried yet"

    def try_acquire(self) -> bool:
        """Take the lock if it is free; True while this server holds it."""
        if self.held:
            return True
        dialect = self._engine.dialect.name
        if dialect == "postgresql":
            self.held = self._acquire_advisory()
        elif dialect == "sqlite" and (path := _sqlite_file(self._engine)) is not None:
            self.held = self._acquire_file(path.with_name(path.name + ".supervisor.lock"))
        else:
            self.held, self.reason = True, "the only supervisor (nothing to share)"
        return self.held

    def still_held(self) -> bool:
        """False once the lock is lost (the lock's connection broke): stop supervising."""
        if not self.held or self._conn is None:
            return self.held
        try:
            self._conn.execute(text("SELECT 1"))
        except SQLAlchemyError:
            log.error("lost the supervisor lock: its database connection broke; standing by")
            self.release()
            self.reason = "the connection holding the supervisor lock broke"
            return False
        return True

    def release(self) -> None:
        self.held = False
        if self._conn is not None:
            try:
                self._conn.close()  # ends the session, and with it the advisory lock
            except SQLAlchemyError:
                pass
            self._conn = None
        if self._file is not None:
            self._file.close()  # releases the flock
            self._file = None

    def _acquire_advisory(self) -> bool:
        try:
            conn = self._engine.connect()
            # Autocommit: the session lock must not sit inside a transaction left open.
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            got = conn.execute(
                text("SELECT pg_try_advisory_lock(:key)"), {"key": SUPERVISOR_LOCK}
            ).scalar()
        except SQLAlchemyError as exc:
            self.reason = f"the database cannot be reached to take the supervisor lock: {exc}"
            return False
        if not got:
            conn.close()
            self.reason = "another server on this database supervises the runs (advisory lock)"
            return False
        self._conn = conn
        self.reason = "holds the supervisor lock (PostgreSQL advisory lock)"
        return True

    def _acquire_file(self, lock_path: Path) -> bool:
        handle = lock_path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            self.reason = (
                f"another server (pid {holder}) supervises the runs of this SQLite database; "
                "two servers on one database need PostgreSQL (RLCS_DATABASE_URL) to share it"
            )
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle
        self.reason = f"holds {lock_path.name}"
        return True


def _sqlite_file(engine: Engine) -> Path | None:
    database = make_url(str(engine.url)).database
    if not database or database == ":memory:":
        return None
    return Path(database)
