"""The database schema brought up to date by Alembic migrations (core/migrations), at server
start-up or with `python -m core.schema upgrade` (what `rlctl db upgrade` runs). Migrations run
in a writer's transaction (core.db), so two servers starting together migrate one after the
other, never both."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from core.db import WRITER

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_REVISION = re.compile(r'^revision = "([^"]+)"', re.MULTILINE)
_DOWN_REVISION = re.compile(r'^down_revision = "([^"]+)"', re.MULTILINE)


def _newest_revision(versions: Path) -> str | None:
    """The head of the (linear) chain in `versions`, read from the files' `revision` and
    `down_revision` lines: no Alembic needed (it costs the server about 11 MB)."""
    revisions, replaced = set(), set()
    for path in versions.glob("*.py"):
        text = path.read_text()
        if found := _REVISION.search(text):
            revisions.add(found[1])
        if found := _DOWN_REVISION.search(text):
            replaced.add(found[1])
    newest = revisions - replaced
    return newest.pop() if len(newest) == 1 else None


# A database already at HEAD is left alone without loading Alembic: only a start that
# migrates pays for it (tests/test_schema.py checks HEAD against Alembic's own head).
HEAD = _newest_revision(MIGRATIONS / "versions")

if TYPE_CHECKING:
    from alembic.config import Config


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Apply every migration up to `revision`; the revision the database is at afterwards."""
    if revision == "head" and recorded(engine) == HEAD:
        return HEAD
    from alembic import command  # imported here: only a start that migrates needs it

    with engine.execution_options(**WRITER).begin() as conn:
        command.upgrade(_config(conn), revision)
        return current(conn)


def recorded(engine: Engine) -> str | None:
    """The revision the database records, read without Alembic; None before any."""
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except SQLAlchemyError:  # no such table yet
        return None


def current(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def head() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config(None)).get_current_head()


def _config(conn: Connection | None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


def main(argv: list[str] | None = None) -> int:
    """`python -m core.schema upgrade`: the database of RLCS_DATABASE_URL (or the default)."""
    import argparse

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from core.db import make_engine
    from core.settings import Settings

    parser = argparse.ArgumentParser(prog="python -m core.schema", description=main.__doc__)
    parser.add_argument("action", choices=["upgrade"])
    parser.parse_args(argv)
    url = Settings().db_url
    shown = make_url(url).render_as_string(hide_password=True)
    try:
        revision = upgrade(make_engine(url))
    except SQLAlchemyError as exc:
        print(f"cannot upgrade {shown}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"{shown}: schema at revision {revision} (the newest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
