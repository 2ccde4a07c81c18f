"""SQLAlchemy models: API keys, datasets, jobs. Alembic (migrations/) is the only way the schema changes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from core.status import JobStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return str(uuid.uuid4())


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(200), index=True)
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    key_hash: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Dataset(Base):
    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(200), index=True)
    name: Mapped[str] = mapped_column(String(500))
    source_format: Mapped[str] = mapped_column(String(16))
    path: Mapped[str] = mapped_column(Text)
    n_rows: Mapped[int] = mapped_column(BigInteger)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    columns: Mapped[list[Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
        Index("ix_jobs_owner_created", "owner", "created_at"),
        Index("ix_jobs_status_heartbeat", "status", "heartbeat_at"),
        Index("ix_jobs_status_queue_enqueued", "status", "queue", "enqueued_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(64), index=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    dataset_ids: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    status: Mapped[str] = mapped_column(String(16), index=True, default=JobStatus.QUEUED)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    stage: Mapped[str | None] = mapped_column(String(200), nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    device: Mapped[str | None] = mapped_column(String(200), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # The Celery queue the job's message goes to, and when a message was last sent: the reaper re-sends a
    # lost message to this queue, and only once the last one has had the stale limit to be taken.
    queue: Mapped[str | None] = mapped_column(String(200), nullable=True)
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    timings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    artifacts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # A sweep's member knows its group, its place in it and the grid values that made it; every job
    # has a priority (low, normal, high) that orders the queue.
    group_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("job_groups.id", ondelete="SET NULL", name="fk_jobs_group_id_job_groups"), nullable=True,
        index=True,
    )
    group_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    group_values: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    priority: Mapped[str] = mapped_column(String(8), default="normal", server_default="normal")


class JobGroup(Base):
    """A sweep: one submission that made many member jobs (``Job.group_id``), from a base spec and
    a parameter grid or a list of specs. Status and progress are aggregated from the members when read."""

    __tablename__ = "job_groups"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_job_groups_owner_idempotency_key"),
        Index("ix_job_groups_owner_created", "owner", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(200))
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # The request as validated: {"base": ..., "grid": ...} or {"base": ..., "specs": [...]}
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # The dotted parameter paths that vary between members (the grid's keys, or every path a spec sets)
    varying: Mapped[list[Any]] = mapped_column(JSON, default=list)
    member_count: Mapped[int] = mapped_column(Integer)
    priority: Mapped[str] = mapped_column(String(8), default="low")
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class JobEvent(Base):
    """One line of a job's log: its status changes, stages, retries, re-queues and warnings, as
    the API and the worker wrote them; served at ``GET /v1/jobs/{id}/events``."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    # Integer, not BigInteger: SQLite assigns increasing ids only to an INTEGER PRIMARY KEY.
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    level: Mapped[str] = mapped_column(String(16))
    type: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(String(1000))
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class WebhookDelivery(Base):
    """A job's or group's ``callback_url`` and how calling it went: ``waiting`` until its subject
    finishes, then ``pending`` (attempts due at ``next_attempt_at``), ``delivered`` or ``failed`` (attempts
    spent or the target refused by the server's settings). The workers deliver (worker/webhooks.py), so a
    restart loses nothing; ``attempt_log`` holds one short record per attempt."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("subject_type", "subject_id", name="uq_webhook_deliveries_subject"),
        Index("ix_webhook_deliveries_status_next", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    subject_type: Mapped[str] = mapped_column(String(8))  # "job" or "group"
    subject_id: Mapped[str] = mapped_column(String(36))
    owner: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="waiting")
    body: Mapped[str | None] = mapped_column(Text, nullable=True)  # the exact bytes signed and sent, once finished
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    attempt_log: Mapped[list[Any]] = mapped_column(JSON, default=list)
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class JobChunk(Base):
    """One chunk of a job fanned out over workers: a part of a Celery chord whose task id is the
    chunk's id. Chunk 0 is the lead the parent's worker computed before the fan-out. A chunk has the life of
    a job (queued, running, succeeded, failed, cancelled; attempts, heartbeat, the reaper re-runs it alone);
    ``spec`` says what it computes and ``output`` holds its partial result until the reduction."""

    __tablename__ = "job_chunks"
    __table_args__ = (
        UniqueConstraint("job_id", "chunk_index", name="uq_job_chunks_job_id_chunk_index"),
        Index("ix_job_chunks_status_heartbeat", "status", "heartbeat_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    chunk_index: Mapped[int] = mapped_column(Integer)
    group_id: Mapped[str] = mapped_column(String(36))  # the chord's group id (Celery's)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    device: Mapped[str | None] = mapped_column(String(200), nullable=True)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    queue: Mapped[str | None] = mapped_column(String(200), nullable=True)
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    output: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    timings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
