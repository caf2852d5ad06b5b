"""Rollouts you can read (issue 37): each step's kept episodes (`rollout`) and the step's
record of them (`rolloutstep`), written by runners and read by the API, the CLI, MCP and the
dashboard (DESIGN §14).

Revision ID: 0005_rollouts
Revises: 0004_run_source
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_rollouts"
down_revision = "0004_run_source"
branch_labels = None
depends_on = None

WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "rollout",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("run.id"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("group_index", sa.Integer()),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("reward", sa.Float()),
        sa.Column("advantage", sa.Float()),
        sa.Column("picked", sa.String(8), nullable=False),
        sa.Column("prompt_key", sa.String(16), nullable=False),
        sa.Column("body_json", sa.String(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
    )
    op.create_index("ix_rollout_run_step", "rollout", ["run_id", "step", "id"])
    op.create_index("ix_rollout_run_prompt", "rollout", ["run_id", "prompt_key"])
    op.create_table(
        "rolloutstep",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("run.id"), primary_key=True),
        sa.Column("step", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("sampled", sa.Integer(), nullable=False),
        sa.Column("recorded", sa.Integer(), nullable=False),
        sa.Column("kept", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("reward_mean", sa.Float()),
        sa.Column("reward_min", sa.Float()),
        sa.Column("reward_max", sa.Float()),
        sa.Column("metrics_json", sa.String(), nullable=False),
        sa.Column("note", sa.String()),
        sa.Column("created_at", WHEN, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rolloutstep")
    op.drop_index("ix_rollout_run_prompt", "rollout")
    op.drop_index("ix_rollout_run_step", "rollout")
    op.drop_table("rollout")
