"""Idempotent submission: a client's Idempotency-Key per job, unique per user.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(128), nullable=True))
    # NULLs are distinct in both SQLite and PostgreSQL: jobs without a key never collide
    op.create_index(
        "ix_jobs_user_idempotency_key", "jobs", ["user", "idempotency_key"], unique=True
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_user_idempotency_key", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("idempotency_key")
