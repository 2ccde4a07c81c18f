"""jobs: the queue a job is sent to and when it was last sent

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 23:00:00

Both columns are nullable: rows written before this revision have no queue, and the reaper treats such a
job as belonging to the queue of the worker that finds it (what the code did before).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queue", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_jobs_status_queue_enqueued", ["status", "queue", "enqueued_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_status_queue_enqueued")
        batch_op.drop_column("enqueued_at")
        batch_op.drop_column("queue")
