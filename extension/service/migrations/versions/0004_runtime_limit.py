"""Runtime limits: a plan's default and maximum, a job's limit and its timeout under way.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: no default / no maximum on this plan (every plan before this revision)
    with op.batch_alter_table("plans") as batch:
        batch.add_column(sa.Column("runtime_default", sa.Float, nullable=True))
        batch.add_column(sa.Column("runtime_max", sa.Float, nullable=True))
    # NULL: no limit (every job before this revision); no job was being timed out
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("max_runtime", sa.Float, nullable=True))
        batch.add_column(
            sa.Column("timeout_requested", sa.Boolean, nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("timeout_requested")
        batch.drop_column("max_runtime")
    with op.batch_alter_table("plans") as batch:
        batch.drop_column("runtime_max")
        batch.drop_column("runtime_default")
