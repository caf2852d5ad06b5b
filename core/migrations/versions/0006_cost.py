"""What a run spent (issue 36): its device and CPU seconds and the tokens it prefilled,
sampled and trained, totalled over its attempts as it records its steps (core/cost.py), so a
list of runs reads them from the row.

Revision ID: 0006_cost
Revises: 0005_rollouts
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_cost"
down_revision = "0005_rollouts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("cost_device", sa.String(16), nullable=True))
        batch.add_column(sa.Column("cost_device_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("cost_cpu_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("cost_tokens_prefill", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("cost_tokens_sampled", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("cost_tokens_trained", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        for name in (
            "cost_tokens_trained",
            "cost_tokens_sampled",
            "cost_tokens_prefill",
            "cost_cpu_s",
            "cost_device_s",
            "cost_device",
        ):
            batch.drop_column(name)
