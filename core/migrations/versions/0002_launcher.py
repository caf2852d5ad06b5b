"""Runs record the launcher that started them and their Ray job id (issue 15), so a server
restarted under another RLCS_LAUNCHER still adopts each run the way it was started.

Revision ID: 0002_launcher
Revises: 0001_baseline
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_launcher"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite alters a table by copying it; PostgreSQL alters it in place.
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("launcher", sa.String(), nullable=True))
        batch.add_column(sa.Column("job_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_column("job_id")
        batch.drop_column("launcher")
