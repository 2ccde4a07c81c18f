"""job chunks (a job fanned out over workers as a Celery chord, issue 19)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26 07:00:00

A new table only: existing jobs have no chunks and run as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_chunks",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("chunk_index", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.String(length=36), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("device", sa.String(length=200), nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=True),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("timings", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "chunk_index", name="uq_job_chunks_job_id_chunk_index"),
    )
    op.create_index("ix_job_chunks_job_id", "job_chunks", ["job_id"], unique=False)
    op.create_index("ix_job_chunks_status_heartbeat", "job_chunks", ["status", "heartbeat_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_chunks_status_heartbeat", table_name="job_chunks")
    op.drop_index("ix_job_chunks_job_id", table_name="job_chunks")
    op.drop_table("job_chunks")
