"""Fair share over days: whether a job started as a starved gang (docs/scheduling.md
"Admission 6").

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # no job started as a starved gang before this revision
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("aged", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("aged")
