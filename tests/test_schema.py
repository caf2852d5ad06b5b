"""The schema comes from Alembic migrations: they build what the models describe, upgrade a
database made before migrations existed, and run once when two migrators start together; on
a real SQLite file and a real PostgreSQL. A bad database URL stops the server in one line."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import MetaData, inspect
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

import core.models  # noqa: F401  (the tables)
from core import schema
from core.db import make_engine


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


def test_migrations_build_what_the_models_describe(engine: Engine) -> None:
    schema.upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
        assert diff == []
        assert schema.current(conn) == schema.head()


def test_the_recorded_head_is_the_newest_migration(engine: Engine) -> None:
    assert schema.HEAD == schema.head()  # a new migration must move HEAD too
    assert schema.recorded(engine) is None
    assert schema.upgrade(engine) == schema.HEAD == schema.recorded(engine)
    assert schema.upgrade(engine) == schema.HEAD  # already there: nothing to do


def _baseline_metadata() -> MetaData:
    """The tables as start-up created them before migrations: 0001's frozen copy."""
    path = schema.MIGRATIONS / "versions" / "0001_baseline.py"
    spec = importlib.util.spec_from_file_location("baseline_0001", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.metadata


def test_a_database_from_before_migrations_is_upgraded_in_place(engine: Engine) -> None:
    _baseline_metadata().create_all(engine)  # what start-up did before migrations
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_metric_run_step")  # made by a still older start-up
        conn.exec_driver_sql(
            "INSERT INTO selection (id, environment, selected_at) "
            "VALUES (1, 'arithmetic', '2026-11-01 00:00:00')"
        )
    schema.upgrade(engine)
    indexes = {i["name"] for i in inspect(engine).get_indexes("metric")}
    assert "ix_metric_run_step" in indexes
    with engine.connect() as conn:
        assert schema.current(conn) == schema.head()
        assert conn.exec_driver_sql("SELECT environment FROM selection").scalar() == "arithmetic"
    columns = {c["name"] for c in inspect(engine).get_columns("run")}
    assert {"launcher", "job_id"} <= columns  # 0002 added them to the old table


def test_two_migrators_at_once_migrate_once(database_url: str) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def migrate() -> None:
        engine = make_engine(database_url)
        start.wait()
        try:
            schema.upgrade(engine)
        except BaseException as exc:  # collected: the test fails on any
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=migrate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    engine = make_engine(database_url)
    with engine.connect() as conn:
        assert schema.current(conn) == schema.head()
    engine.dispose()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("not a url", "RLCS_DATABASE_URL is not a database URL"),
        ("postgresql+psycopg://rlcs@127.0.0.1:1/rlcs", "RLCS_DATABASE_URL: cannot use"),
    ],
)
def test_a_bad_database_url_stops_the_server_with_one_line(
    tmp_path: Path, url: str, says: str
) -> None:
    env = {**os.environ, "RLCS_VAR_DIR": str(tmp_path), "RLCS_DATABASE_URL": url}
    env["RLCS_PORT"] = "1"  # never reached: the check comes first
    done = subprocess.run(
        [sys.executable, "-m", "server"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
