"""Baseline: the tables as they were before migrations (runs, metrics, checkpoints, configs,
the selection). Idempotent on purpose: a database made before Alembic (tables created at
start-up) gets whatever index it lacks and is then stamped, a new one gets everything.

Revision ID: 0001_baseline
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None

# A frozen copy of the schema of that time: later model changes come as later revisions.
metadata = sa.MetaData()
STATUSES = ("queued", "starting", "running", "stopping", "succeeded", "failed", "stopped")
WHEN = sa.DateTime(timezone=True)

sa.Table(
    "environmentconfig",
    metadata,
    sa.Column("environment", sa.String(), primary_key=True),
    sa.Column("version", sa.Integer(), primary_key=True),
    sa.Column("values_json", sa.String(), nullable=False),
    sa.Column("updated_at", WHEN, nullable=False),
)
sa.Table(
    "run",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("environment", sa.String(), nullable=False, index=True),
    sa.Column("status", sa.Enum(*STATUSES, name="runstatus"), nullable=False, index=True),
    sa.Column("config_json", sa.String(), nullable=False),
    sa.Column("config_hash", sa.String(), nullable=False),
    sa.Column("step", sa.Integer(), nullable=False),
    sa.Column("total_steps", sa.Integer(), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("pid", sa.Integer()),
    sa.Column("process_start", sa.Float()),
    sa.Column("exit_code", sa.Integer()),
    sa.Column("failure_kind", sa.String()),
    sa.Column("details", sa.String()),
    sa.Column("wandb_path", sa.String()),
    sa.Column("wandb_url", sa.String()),
    sa.Column("weights_path", sa.String()),
    sa.Column("run_dir", sa.String(), nullable=False),
    sa.Column("idempotency_key", sa.String(), unique=True),
    sa.Column("created_at", WHEN, nullable=False, index=True),
    sa.Column("started_at", WHEN),
    sa.Column("last_step_at", WHEN),
    sa.Column("stop_requested_at", WHEN),
    sa.Column("finished_at", WHEN),
)
sa.Table(
    "selection",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("environment", sa.String(), nullable=False),
    sa.Column("selected_at", WHEN, nullable=False),
)
sa.Table(
    "checkpoint",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("run_id", sa.String(), sa.ForeignKey("run.id"), nullable=False, index=True),
    sa.Column("step", sa.Integer(), nullable=False),
    sa.Column("kind", sa.String(), nullable=False),
    sa.Column("name", sa.String(), nullable=False),
    sa.Column("path", sa.String(), nullable=False),
    sa.Column("created_at", WHEN, nullable=False),
)
sa.Table(
    "metric",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("run_id", sa.String(), sa.ForeignKey("run.id"), nullable=False, index=True),
    sa.Column("step", sa.Integer(), nullable=False),
    sa.Column("values_json", sa.String(), nullable=False),
    sa.Column("created_at", WHEN, nullable=False),
    sa.Index("ix_metric_run_step", "run_id", "step", "id"),
)


def upgrade() -> None:
    bind = op.get_bind()
    metadata.create_all(bind, checkfirst=True)
    # create_all skips a table that exists, and its indexes with it: add those it lacks.
    for table in metadata.sorted_tables:
        for index in table.indexes:
            index.create(bind, checkfirst=True)


def downgrade() -> None:
    metadata.drop_all(op.get_bind())
