"""Alembic's entry: migrations run on the connection `core.schema.upgrade` hands over, inside
its transaction (which holds the migration lock)."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import core.models  # noqa: F401  (registers the tables: the metadata autogenerate compares)


def run_migrations() -> None:
    connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=SQLModel.metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying
    )
    with context.begin_transaction():
        context.run_migrations()


if getattr(context, "config", None) is not None:  # run by Alembic (not merely imported)
    run_migrations()
