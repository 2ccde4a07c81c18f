"""Job rows: creation, listing, cancel, deletion and retention, priorities; their lifecycle (claim, progress,
heartbeat, finish, release, re-queue of a lost worker's job) is store/work.py's, shared with chunks, and named here
for jobs. Every transition is one conditional UPDATE, so a race has one winner; a queued job may also be cancelled
(queued -> cancelled).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, delete, event, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.status import ACTIVE_STATUSES, TERMINAL_STATUSES, JobPriority, JobStatus
from store import work
from store.artifacts import delete_job_files
from store.chunks import delete_chunks
from store.events import EventType, add_event, delete_events
from store.models import Job, utcnow
from store.webhooks import SubjectType, delete_deliveries


def create_job(
    session: Session,
    *,
    owner: str,
    kind: str,
    params: dict[str, Any],
    dataset_ids: dict[str, str],
    idempotency_key: str | None = None,
    queue: str | None = None,
    priority: JobPriority = JobPriority.NORMAL,
) -> tuple[Job, bool]:
    """Insert a queued job for ``queue``; with an idempotency key already used by this owner, return that
    job instead. The caller sends its message right after committing, so the row says it was sent now.

    Returns ``(job, created)``.
    """
    if idempotency_key is not None:
        existing = find_by_idempotency_key(session, owner, idempotency_key)
        if existing is not None:
            return existing, False
    job = Job(
        owner=owner, kind=kind, params=params, dataset_ids=dataset_ids, idempotency_key=idempotency_key,
        queue=queue, enqueued_at=utcnow(), priority=priority.value,
    )
    session.add(job)
    try:
        session.flush()
    except IntegrityError:
        # A concurrent POST with the same key won the insert: answer with its job.
        session.rollback()
        existing = find_by_idempotency_key(session, owner, idempotency_key or "")
        if existing is None:
            raise
        return existing, False
    add_event(session, job.id, EventType.SUBMITTED, f"submitted ({kind}, priority {priority.value})")
    return job, True


def find_by_idempotency_key(session: Session, owner: str, key: str) -> Job | None:
    return session.scalars(select(Job).where(Job.owner == owner, Job.idempotency_key == key)).first()


def get_job(session: Session, job_id: str, owner: str | None = None) -> Job | None:
    """The job, or None when it does not exist or belongs to another owner."""
    job = session.get(Job, job_id)
    if job is None or (owner is not None and job.owner != owner):
        return None
    return job


def list_jobs(
    session: Session,
    *,
    owner: str,
    kind: str | None = None,
    status: JobStatus | None = None,
    group_id: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[Sequence[Job], int]:
    """A page of the owner's jobs, newest first (a group's members in group order), and the total count
    matching the filters."""
    conditions = [Job.owner == owner]
    if group_id is not None:
        conditions.append(Job.group_id == group_id)
    if kind is not None:
        conditions.append(Job.kind == kind)
    if status is not None:
        conditions.append(Job.status == status)
    total = session.scalar(select(func.count()).select_from(Job).where(*conditions)) or 0
    page = session.scalars(
        select(Job).where(*conditions)
        .order_by(*((Job.group_index,) if group_id is not None else (Job.created_at.desc(), Job.id)))
        .limit(limit).offset(offset)
    ).all()
    return page, total


def count_by_kind_and_status(session: Session) -> list[tuple[str, str, int]]:
    rows = session.execute(select(Job.kind, Job.status, func.count()).group_by(Job.kind, Job.status)).all()
    return [(kind, status, count) for kind, status, count in rows]


def claim(session: Session, job_id: str, *, worker: str, device: str, now: datetime | None = None) -> bool:
    """queued -> running for this worker (store/work.py)."""
    return work.claim(session, Job, job_id, worker=worker, device=device, now=now)


def record_progress(session: Session, job_id: str, *, worker: str, progress: float, stage: str | None) -> bool:
    """Heartbeat plus progress; returns whether the job was asked to cancel (or is no longer ours)."""
    return work.record_progress(session, Job, job_id, worker=worker, progress=progress, stage=stage)


def heartbeat(session: Session, job_id: str, *, worker: str) -> None:
    work.heartbeat(session, Job, job_id, worker=worker)


def finish(
    session: Session,
    job_id: str,
    *,
    worker: str,
    status: JobStatus,
    result: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    timings: dict[str, Any] | None = None,
    artifacts: dict[str, Any] | None = None,
) -> bool:
    """running -> a terminal status, only for the worker that holds the job (store/work.py)."""
    return work.finish(session, Job, job_id, worker=worker, status=status, result=result, error=error,
                       timings=timings, artifacts=artifacts)


def finished_by(session: Session, job_id: str, *, worker: str, status: JobStatus) -> bool:
    """Whether the job already ended with ``status`` in the hands of ``worker`` (a retried :func:`finish`)."""
    return work.finished_by(session, Job, job_id, worker=worker, status=status)


def is_settled(session: Session, job_id: str) -> bool:
    """Whether the job is gone or has ended (nothing will run it again)."""
    status = session.scalar(select(Job.status).where(Job.id == job_id))
    return status is None or status in TERMINAL_STATUSES


def request_cancel(session: Session, job_id: str, owner: str) -> Job | None:
    """Cancel a queued job at once; flag a running one for its next checkpoint; leave finished ones."""
    now = utcnow()
    if session.execute(
        update(Job)
        .where(Job.id == job_id, Job.owner == owner, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.CANCELLED, cancel_requested=True, finished_at=now, stage="cancelled before start")
        .execution_options(synchronize_session=False)
    ).rowcount:
        add_event(session, job_id, EventType.CANCELLED, "cancelled before start")
    if session.execute(
        update(Job)
        .where(Job.id == job_id, Job.owner == owner, Job.status == JobStatus.RUNNING,
               Job.cancel_requested.is_(False))
        .values(cancel_requested=True)
        .execution_options(synchronize_session=False)
    ).rowcount:
        add_event(session, job_id, EventType.CANCEL_REQUESTED, "cancel requested: the job stops at its next checkpoint")
    session.expire_all()
    return get_job(session, job_id, owner)


def stale_running_jobs(session: Session, *, stale_after: timedelta, now: datetime | None = None) -> list[Job]:
    """Running jobs whose worker went silent (a fanned-out job's chunks are watched instead)."""
    return work.stale_running(session, Job, stale_after=stale_after, now=now)


def requeue_or_fail_stale(session: Session, job: Job, *, max_attempts: int,
                          outcome_kept: bool = False) -> JobStatus | None:
    """Return a job whose worker went silent to the queue, or fail it when its attempts are spent (store/work.py)."""
    return work.requeue_or_fail_stale(session, job, max_attempts=max_attempts, outcome_kept=outcome_kept)


def release(session: Session, job_id: str, *, worker: str, stage: str) -> bool:
    """running -> queued for the worker that holds the job, which stops without the run having failed."""
    return work.release(session, Job, job_id, worker=worker, stage=stage)


def queued_job_ids(session: Session, *, queue: str, not_sent_for: timedelta) -> list[str]:
    """Queued jobs of ``queue`` whose last message was sent longer than ``not_sent_for`` ago."""
    return work.lost_queued(session, Job, queue=queue, not_sent_for=not_sent_for)


def mark_resent(session: Session, job_id: str, *, queue: str, not_sent_for: timedelta) -> bool:
    """Stamp a new send time on a queued job still unsent for ``not_sent_for``; one party wins."""
    return work.mark_resent(session, Job, job_id, queue=queue, not_sent_for=not_sent_for)


def mark_enqueued(session: Session, job_id: str) -> None:
    """Record that a message for this queued job is being sent now."""
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
        .values(enqueued_at=utcnow())
        .execution_options(synchronize_session=False)
    )


def jobs_using_dataset(session: Session, owner: str, dataset_id: str) -> list[str]:
    """Ids of the owner's queued or running jobs that read ``dataset_id`` (such a dataset must not go)."""
    rows = session.execute(
        select(Job.id, Job.dataset_ids).where(Job.owner == owner, Job.status.in_(ACTIVE_STATUSES))
    ).all()
    return [job_id for job_id, ids in rows if dataset_id in (ids or {}).values()]


def queue_depth(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Job).where(Job.status == JobStatus.QUEUED)) or 0


class JobNotFinishedError(ValueError):
    """A queued or running job cannot be deleted: cancel it first."""

    def __init__(self, job: Job) -> None:
        super().__init__(job.status)
        self.status = job.status


def delete_files_after_commit(session: Session, job_ids: Sequence[str]) -> None:
    """The deleted jobs' files go once the deletion is committed (a failed commit keeps rows and files)."""
    def remove_files(_session: Session) -> None:
        for job_id in job_ids:
            delete_job_files(job_id)

    event.listen(session, "after_commit", remove_files, once=True)


def delete_finished_job(session: Session, job_id: str, owner: str) -> bool:
    """Delete the owner's finished job (row, result, artifacts): False if there is no such job; raises
    :class:`JobNotFinishedError` for a queued or running one (a worker may be writing it)."""
    job = get_job(session, job_id, owner)
    if job is None:
        return False
    if job.status not in TERMINAL_STATUSES:
        raise JobNotFinishedError(job)
    # conditional on the status, like every transition: a job that (re)started meanwhile stays
    deleted = session.execute(
        delete(Job).where(Job.id == job_id, Job.owner == owner, Job.status.in_(TERMINAL_STATUSES))
        .execution_options(synchronize_session=False)
    ).rowcount
    if not deleted:
        raise JobNotFinishedError(job)
    delete_events(session, [job_id])
    delete_chunks(session, [job_id])
    delete_deliveries(session, SubjectType.JOB, [job_id])
    delete_files_after_commit(session, [job_id])
    return True


def expire_finished_jobs(session: Session, *, default_days: float, days_by_owner: dict[str, float],
                         now: datetime | None = None, limit: int = 500) -> list[str]:
    """Delete finished jobs older than their owner's retention (``days_by_owner``, else ``default_days``;
    0 keeps them) by their finish time; at most ``limit`` a call. Returns the deleted ids."""
    now = now or utcnow()
    expired: list[str] = []
    owners = {owner for (owner,) in session.execute(select(Job.owner).distinct()).all()}
    for owner in sorted(owners):
        days = days_by_owner.get(owner, default_days)
        if days <= 0 or len(expired) >= limit:
            continue
        rows = session.execute(
            select(Job.id).where(Job.owner == owner, Job.status.in_(TERMINAL_STATUSES),
                                 Job.finished_at < now - timedelta(days=days))
            .order_by(Job.finished_at).limit(limit - len(expired))
        ).all()
        expired += [job_id for (job_id,) in rows]
    if expired:
        delete_events(session, expired)
        delete_chunks(session, expired)
        delete_deliveries(session, SubjectType.JOB, expired)
        session.execute(delete(Job).where(Job.id.in_(expired)).execution_options(synchronize_session=False))
        delete_files_after_commit(session, expired)
    return expired


def count_active(session: Session, owner: str) -> int:
    """The owner's queued and running jobs (what the running-jobs quota counts)."""
    return session.scalar(
        select(func.count()).select_from(Job).where(Job.owner == owner, Job.status.in_(ACTIVE_STATUSES))
    ) or 0


def _priority_rank() -> Any:
    return case({priority.value: priority.rank for priority in JobPriority}, value=Job.priority, else_=1)


def queued_job_before(session: Session, job_id: str, *, queue: str) -> str | None:
    """The queued job of ``queue`` that should run before ``job_id``: the oldest of the highest priority above
    ``job_id``'s, or None. The broker's order is only a hint (kombu's SQLAlchemy transport has no priorities;
    Redis's are approximate); a worker handed ``job_id`` runs this one instead (see worker.execute)."""
    mine = session.scalar(select(Job.priority).where(Job.id == job_id))
    if mine is None:
        return None
    above = [priority.value for priority in JobPriority if priority.rank > JobPriority(mine).rank]
    if not above:
        return None
    return session.scalar(
        select(Job.id)
        .where(Job.status == JobStatus.QUEUED, work.on_queue(Job, queue), Job.priority.in_(above),
               Job.cancel_requested.is_(False))
        .order_by(_priority_rank().desc(), Job.created_at, Job.id)
        .limit(1)
    )


def priority_of(session: Session, job_id: str) -> JobPriority:
    """The job's priority (normal for a job that is gone: its message is a no-op anyway)."""
    value = session.scalar(select(Job.priority).where(Job.id == job_id))
    return JobPriority(value) if value in JobPriority.__members__.values() else JobPriority.NORMAL
