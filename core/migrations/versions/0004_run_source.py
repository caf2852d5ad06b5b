"""A run's source (issue 28): "api" for runs started through our API, "tinker-api" for the
session of a Tinker SDK script served by the server's Tinker API.

Revision ID: 0004_run_source
Revises: 0003_agents
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_run_source"
down_revision = "0003_agents"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("source", sa.String(16), nullable=False, server_default="api"))


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_column("source")
