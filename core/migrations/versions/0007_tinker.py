"""Tinker checkpoints' time to live and publication (issue 35): `expires_at` (a checkpoint
saved or set with ttl_seconds is deleted once it passes) and `public` (publish_checkpoint
recorded, shown in the RestClient's lists).

Revision ID: 0007_tinker
Revises: 0006_cost
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_tinker"
down_revision = "0006_cost"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoint") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(
            sa.Column("public", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("checkpoint") as batch:
        batch.drop_column("public")
        batch.drop_column("expires_at")
