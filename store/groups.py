"""Job groups (sweeps): one row per group and its member jobs, created in one transaction; the
group's status, progress and counts are aggregated from the members whenever they are read, so there is no
second copy of a member's state to fall out of step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.status import ACTIVE_STATUSES, TERMINAL_STATUSES, JobPriority, JobStatus
from store.chunks import delete_chunks
from store.events import EventType, add_event, delete_events
from store.group_summary import GroupSummary as GroupSummary  # the API's group routes read it through here
from store.group_summary import summarize as summarize
from store.jobs import delete_files_after_commit
from store.models import Job, JobGroup, utcnow
from store.webhooks import SubjectType, delete_deliveries


@dataclass(frozen=True)
class MemberSpec:
    """One member to create: its validated spec and the grid values (dotted path -> value) that made it."""

    kind: str
    params: dict[str, Any]
    dataset_ids: dict[str, str]
    values: dict[str, Any]


def find_by_idempotency_key(session: Session, owner: str, key: str) -> JobGroup | None:
    return session.scalars(select(JobGroup).where(JobGroup.owner == owner, JobGroup.idempotency_key == key)).first()


def create_group(
    session: Session,
    *,
    owner: str,
    name: str | None,
    spec: dict[str, Any],
    varying: list[str],
    members: Sequence[MemberSpec],
    priority: JobPriority,
    queue: str,
    idempotency_key: str | None = None,
) -> tuple[JobGroup, list[str], bool]:
    """Insert the group and its queued members (in the caller's transaction: all or none). With an
    idempotency key this owner used already, return that group instead. Returns ``(group, member ids,
    created)``; the caller sends the members' messages right after committing."""
    if idempotency_key is not None:
        existing = find_by_idempotency_key(session, owner, idempotency_key)
        if existing is not None:
            return existing, member_ids(session, existing.id), False
    group = JobGroup(
        owner=owner,
        name=name,
        spec=spec,
        varying=varying,
        member_count=len(members),
        priority=priority.value,
        idempotency_key=idempotency_key,
    )
    session.add(group)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()  # a concurrent POST with the same key won the insert: answer with its group
        existing = find_by_idempotency_key(session, owner, idempotency_key or "")
        if existing is None:
            raise
        return existing, member_ids(session, existing.id), False
    now = utcnow()
    jobs = [
        Job(
            owner=owner,
            kind=member.kind,
            params=member.params,
            dataset_ids=member.dataset_ids,
            queue=queue,
            enqueued_at=now,
            priority=priority.value,
            group_id=group.id,
            group_index=index,
            group_values=member.values,
        )
        for index, member in enumerate(members)
    ]
    session.add_all(jobs)
    session.flush()
    for index, job in enumerate(jobs):
        add_event(
            session,
            job.id,
            EventType.SUBMITTED,
            f"submitted as member {index} of group {group.id} ({job.kind}, priority {priority.value})",
        )
    return group, [job.id for job in jobs], True


def get_group(session: Session, group_id: str, owner: str) -> JobGroup | None:
    """The group, or None when it does not exist or belongs to another owner."""
    group = session.get(JobGroup, group_id)
    return group if group is not None and group.owner == owner else None


def list_groups(session: Session, *, owner: str, limit: int, offset: int) -> tuple[Sequence[JobGroup], int]:
    total = session.scalar(select(func.count()).select_from(JobGroup).where(JobGroup.owner == owner)) or 0
    page = session.scalars(
        select(JobGroup)
        .where(JobGroup.owner == owner)
        .order_by(JobGroup.created_at.desc(), JobGroup.id)
        .limit(limit)
        .offset(offset)
    ).all()
    return page, total


def member_ids(session: Session, group_id: str) -> list[str]:
    return list(session.scalars(select(Job.id).where(Job.group_id == group_id).order_by(Job.group_index)).all())


def cancel_group(session: Session, group: JobGroup) -> tuple[int, int]:
    """Cancel the queued members at once and flag the running ones for their next checkpoint; finished
    members stay as they are. Returns ``(cancelled now, flagged)``."""
    now = utcnow()
    group.cancel_requested = True
    cancelled = session.scalars(
        update(Job)
        .where(Job.group_id == group.id, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.CANCELLED, cancel_requested=True, finished_at=now, stage="cancelled before start")
        .returning(Job.id)
        .execution_options(synchronize_session=False)
    ).all()
    flagged = session.scalars(
        update(Job)
        .where(Job.group_id == group.id, Job.status == JobStatus.RUNNING, Job.cancel_requested.is_(False))
        .values(cancel_requested=True)
        .returning(Job.id)
        .execution_options(synchronize_session=False)
    ).all()
    for job_id in cancelled:
        add_event(session, job_id, EventType.CANCELLED, "cancelled before start (its group was cancelled)")
    for job_id in flagged:
        add_event(
            session,
            job_id,
            EventType.CANCEL_REQUESTED,
            "cancel requested (its group was cancelled): the job stops at its next checkpoint",
        )
    return len(cancelled), len(flagged)


@dataclass(frozen=True)
class MemberRow:
    index: int
    job_id: str
    status: str
    values: dict[str, Any]
    result: dict[str, Any] | None


def member_rows(session: Session, group_id: str) -> list[MemberRow]:
    """Every member in group order, with its grid values and (once it succeeded) its result."""
    rows = session.execute(
        select(Job.group_index, Job.id, Job.status, Job.group_values, Job.result)
        .where(Job.group_id == group_id)
        .order_by(Job.group_index)
    ).all()
    return [
        MemberRow(
            int(index or 0),
            job_id,
            str(status),
            dict(values or {}),
            dict(result) if status == JobStatus.SUCCEEDED and result is not None else None,
        )
        for index, job_id, status, values, result in rows
    ]


class GroupNotFinishedError(ValueError):
    """A group with queued or running members cannot be deleted: cancel it first."""

    def __init__(self, active: int) -> None:
        super().__init__(active)
        self.active = active


def delete_finished_group(session: Session, group: JobGroup) -> int:
    """Delete a group whose members have all ended, with the members (rows, results, artifacts, logs) and the
    webhooks of both; raises :class:`GroupNotFinishedError` while one is queued or running. Returns the
    members deleted. The members' files go once the deletion is committed."""
    active = session.scalar(
        select(func.count()).select_from(Job).where(Job.group_id == group.id, Job.status.in_(ACTIVE_STATUSES))
    ) or 0
    if active:
        raise GroupNotFinishedError(active)
    ids = member_ids(session, group.id)
    deleted = session.execute(
        delete(Job).where(Job.group_id == group.id, Job.status.in_(TERMINAL_STATUSES))
        .execution_options(synchronize_session=False)
    ).rowcount
    if deleted != len(ids):  # a member changed meanwhile: leave everything as it was
        raise GroupNotFinishedError(len(ids) - deleted)
    delete_events(session, ids)
    delete_chunks(session, ids)
    delete_deliveries(session, SubjectType.JOB, ids)
    delete_deliveries(session, SubjectType.GROUP, [group.id])
    delete_files_after_commit(session, ids)
    session.delete(group)
    return deleted
