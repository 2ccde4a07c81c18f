"""job groups (sweeps), job events, job priority

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 10:00:00

Existing jobs get priority "normal" (the server default) and no group.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_groups",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("varying", sa.JSON(), nullable=False),
        sa.Column("member_count", sa.Integer(), nullable=False),
        sa.Column("priority", sa.String(length=8), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner", "idempotency_key", name="uq_job_groups_owner_idempotency_key"),
    )
    op.create_index("ix_job_groups_owner_created", "job_groups", ["owner", "created_at"], unique=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("group_id", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("group_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("group_values", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("priority", sa.String(length=8), server_default="normal", nullable=False))
        batch_op.create_index("ix_jobs_group_id", ["group_id"], unique=False)
        batch_op.create_foreign_key(
            "fk_jobs_group_id_job_groups", "job_groups", ["group_id"], ["id"], ondelete="SET NULL"
        )
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("message", sa.String(length=1000), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_events_job_id_id", "job_events", ["job_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_events_job_id_id", table_name="job_events")
    op.drop_table("job_events")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint("fk_jobs_group_id_job_groups", type_="foreignkey")
        batch_op.drop_index("ix_jobs_group_id")
        batch_op.drop_column("priority")
        batch_op.drop_column("group_values")
        batch_op.drop_column("group_index")
        batch_op.drop_column("group_id")
    op.drop_index("ix_job_groups_owner_created", table_name="job_groups")
    op.drop_table("job_groups")
