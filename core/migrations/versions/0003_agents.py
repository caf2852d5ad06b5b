"""Agent features (issue 17): sweeps, forks (a run's parent and step), the event outbox,
webhooks and their deliveries.

Revision ID: 0003_agents
Revises: 0002_launcher
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_agents"
down_revision = "0002_launcher"
branch_labels = None
depends_on = None

WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("sweep_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("parent_run_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("parent_step", sa.Integer(), nullable=True))
        batch.create_index("ix_run_sweep_id", ["sweep_id"])
    op.create_table(
        "sweep",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("environment", sa.String(), nullable=False),
        sa.Column("base_json", sa.String(), nullable=False),
        sa.Column("combos_json", sa.String(), nullable=False),
        sa.Column("metric", sa.String(), nullable=False),
        sa.Column("goal", sa.String(), nullable=False),
        sa.Column("idempotency_key", sa.String(), unique=True),
        sa.Column("created_at", WHEN, nullable=False, index=True),
        sa.Column("finished_at", WHEN),
    )
    op.create_table(
        "runevent",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("run_id", sa.String(32), index=True),
        sa.Column("sweep_id", sa.String(32)),
        sa.Column("step", sa.Integer()),
        sa.Column("key", sa.String(), unique=True),
        sa.Column("fanned_out", sa.Boolean(), nullable=False, index=True),
        sa.Column("created_at", WHEN, nullable=False),
    )
    op.create_table(
        "webhook",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("url", sa.String(), nullable=False),
        sa.Column("events_json", sa.String(), nullable=False),
        sa.Column("step_every", sa.Integer(), nullable=False),
        sa.Column("created_at", WHEN, nullable=False),
    )
    op.create_table(
        "webhookdelivery",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("webhook_id", sa.String(32), nullable=False, index=True),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("order_key", sa.String(), nullable=False),
        sa.Column("body", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False, index=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", WHEN, nullable=False),
        sa.Column("last_error", sa.String()),
        sa.Column("last_status_code", sa.Integer()),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("delivered_at", WHEN),
    )
    op.create_index(
        "ix_delivery_webhook_event", "webhookdelivery", ["webhook_id", "event_id"], unique=True
    )


def downgrade() -> None:
    op.drop_index("ix_delivery_webhook_event", "webhookdelivery")
    for table in ("webhookdelivery", "webhook", "runevent", "sweep"):
        op.drop_table(table)
    with op.batch_alter_table("run") as batch:
        batch.drop_index("ix_run_sweep_id")
        for column in ("parent_step", "parent_run_id", "sweep_id"):
            batch.drop_column(column)
