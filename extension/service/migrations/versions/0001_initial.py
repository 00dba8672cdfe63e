"""Initial schema: plans, jobs, transitions, decisions, meta.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("path", sa.String(512), primary_key=True),
        sa.Column("share", sa.Float, nullable=False),
        sa.Column("limit_gpu", sa.Float, nullable=True),
        sa.Column("limit_cpu", sa.Float, nullable=True),
        sa.Column("limit_memory", sa.Float, nullable=True),
        sa.Column("user_leaf", sa.Boolean, nullable=False),
        sa.Column("member_users", sa.JSON, nullable=False),
        sa.Column("member_groups", sa.JSON, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user", sa.String(255), nullable=False, index=True),
        sa.Column("plan", sa.String(512), nullable=False),
        sa.Column("leaf", sa.String(512), nullable=False, index=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("state", sa.String(32), nullable=False, index=True),
        sa.Column("gpu", sa.Float, nullable=False),
        sa.Column("cpu", sa.Float, nullable=False),
        sa.Column("memory", sa.Float, nullable=False),
        sa.Column("limits", sa.JSON, nullable=False),
        sa.Column("min_workers", sa.Integer, nullable=False),
        sa.Column("max_workers", sa.Integer, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("preemptible", sa.Boolean, nullable=False),
        sa.Column("command", sa.JSON, nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("workdir", sa.Text, nullable=False),
        sa.Column("env", sa.JSON, nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("submitted", sa.Float, nullable=False),
        sa.Column("started", sa.Float, nullable=True),
        sa.Column("ended", sa.Float, nullable=True),
        sa.Column("placement", sa.JSON, nullable=False),
        sa.Column("terminating", sa.Boolean, nullable=False),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("preemptions", sa.Integer, nullable=False),
    )
    op.create_table(
        "transitions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False, index=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False, index=True),
        sa.Column("leaf", sa.String(512), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("workers", sa.Integer, nullable=False),
        sa.Column("gpu", sa.Float, nullable=False),
        sa.Column("cpu", sa.Float, nullable=False),
        sa.Column("memory", sa.Float, nullable=False),
        sa.Column("placement", sa.JSON, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_index("ix_transitions_leaf_at", "transitions", ["leaf", "at"])
    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False, index=True),
        sa.Column("job_id", sa.String(64), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_table(
        "meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in ("meta", "decisions", "transitions", "jobs", "plans"):
        op.drop_table(table)
