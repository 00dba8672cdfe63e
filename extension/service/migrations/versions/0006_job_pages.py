"""Pages of GET /jobs: indexes to seek to where the last page ended (paging.py).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_submitted_id", "jobs", ["submitted", "id"])
    op.create_index("ix_jobs_user_submitted_id", "jobs", ["user", "submitted", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_user_submitted_id", table_name="jobs")
    op.drop_index("ix_jobs_submitted_id", table_name="jobs")
