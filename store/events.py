"""A job's log: status changes, stages, retries, re-queues and warnings as rows of ``job_events``,
written in the same transaction as the change they describe, so the log and the job row never disagree."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from store.models import JobEvent

MAX_MESSAGE_CHARS = 1000


class EventLevel(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class EventType(StrEnum):
    """What an event reports: one spelling shared by the writers and the API's schema."""

    SUBMITTED = "submitted"
    STARTED = "started"
    STAGE = "stage"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CANCEL_REQUESTED = "cancel_requested"
    REQUEUED = "requeued"
    RESENT = "resent"
    RETRY = "retry"
    WARNING = "warning"
    WEBHOOK = "webhook"  # a callback_url delivery attempt


def add_event(
    session: Session,
    job_id: str,
    type_: EventType,
    message: str,
    *,
    level: EventLevel = EventLevel.INFO,
    data: dict[str, Any] | None = None,
) -> None:
    """Append one line to the job's log (part of the caller's transaction)."""
    session.add(
        JobEvent(job_id=job_id, type=type_.value, level=level.value, message=message[:MAX_MESSAGE_CHARS], data=data)
    )


def list_events(session: Session, job_id: str, *, limit: int, offset: int) -> tuple[Sequence[JobEvent], int]:
    """A page of the job's events in the order they happened, and their total count."""
    total = session.scalar(select(func.count()).select_from(JobEvent).where(JobEvent.job_id == job_id)) or 0
    page = session.scalars(
        select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id).limit(limit).offset(offset)
    ).all()
    return page, total


def delete_events(session: Session, job_ids: Sequence[str]) -> None:
    """The events of jobs being deleted (SQLite does not enforce the foreign key's ON DELETE CASCADE)."""
    if job_ids:
        session.execute(
            delete(JobEvent).where(JobEvent.job_id.in_(list(job_ids))).execution_options(synchronize_session=False)
        )
