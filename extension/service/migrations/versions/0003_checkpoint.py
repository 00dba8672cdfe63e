"""Checkpoint reports: the time of a job's last checkpoint and the runtime's progress figure.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: no checkpoint reported (every job before this revision)
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("checkpointed", sa.Float, nullable=True))
        batch.add_column(sa.Column("checkpoint_progress", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("checkpoint_progress")
        batch.drop_column("checkpointed")
