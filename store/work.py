"""The lifecycle of a unit of work, a job or a chunk of a fanned-out job: one set of transitions for both, each
one conditional UPDATE, so that a race (a redelivered message, a reaper, a finishing worker, a cancel) has one
winner.

queued -> running -> succeeded | failed | cancelled; running -> queued (re-queued after a lost worker while
attempts remain, or released by a worker that is shutting down).

The functions take the mapped class, :class:`~store.models.Job` or :class:`~store.models.JobChunk`, which share
the columns of the lifecycle. A chunk is work with a parent: it has no stage and no cancel flag of its own (it
stops when its job was cancelled or has ended), its progress and its end update its job's progress, and what
happens to it is written to its job's events.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from core.status import TERMINAL_STATUSES, JobStatus
from store.chunks import FANOUT_WORKER_PREFIX, update_job_progress
from store.events import EventLevel, EventType, add_event
from store.models import Job, JobChunk, utcnow

Work = Job | JobChunk
WorkModel = type[Job] | type[JobChunk]


def _held_by(model: WorkModel, row_id: str, worker: str) -> tuple[Any, ...]:
    return model.id == row_id, model.status == JobStatus.RUNNING, model.worker == worker


def _update(session: Session, model: WorkModel, conditions: tuple[Any, ...], values: dict[str, Any]) -> bool:
    """One conditional UPDATE of one row: whether it won."""
    return session.execute(
        update(model).where(*conditions).values(**values).execution_options(synchronize_session=False)
    ).rowcount == 1


def _job_of(session: Session, chunk_id: str) -> str | None:
    return session.scalar(select(JobChunk.job_id).where(JobChunk.id == chunk_id))


def claim(session: Session, model: WorkModel, row_id: str, *, worker: str, device: str,
          now: datetime | None = None) -> bool:
    """queued -> running for ``worker``, started at ``now`` (default: the current time); False when another
    claim, a cancel or a finish came first."""
    now = now or utcnow()
    conditions: tuple[Any, ...] = (model.id == row_id, model.status == JobStatus.QUEUED)
    values: dict[str, Any] = {"status": JobStatus.RUNNING, "worker": worker, "device": device,
                              "attempts": model.attempts + 1, "started_at": now, "heartbeat_at": now, "progress": 0.0}
    if model is Job:
        conditions += (Job.cancel_requested.is_(False),)
        values["stage"] = "starting"
    if not _update(session, model, conditions, values):
        return False
    if model is Job:
        attempt = session.scalar(select(Job.attempts).where(Job.id == row_id))
        add_event(session, row_id, EventType.STARTED, f"started on {device} (attempt {attempt})",
                  data={"worker": worker, "device": device, "attempt": attempt})
    return True


def heartbeat(session: Session, model: WorkModel, row_id: str, *, worker: str) -> None:
    _update(session, model, _held_by(model, row_id, worker), {"heartbeat_at": utcnow()})


def record_progress(session: Session, model: WorkModel, row_id: str, *, worker: str, progress: float,
                    stage: str | None = None) -> bool:
    """Heartbeat plus progress (a chunk's job gets the chunks' mean, weighted by their size); returns whether
    the work must stop: its job was asked to cancel or has ended (a sibling chunk failed), or it is no longer
    ``worker``'s."""
    values: dict[str, Any] = {"heartbeat_at": utcnow(), "progress": max(0.0, min(1.0, progress))}
    if stage is not None and model is Job:
        values["stage"] = stage[:200]
    if not _update(session, model, _held_by(model, row_id, worker), values):
        return True
    job_id = row_id if model is Job else _job_of(session, row_id)
    if model is JobChunk and job_id is not None:
        update_job_progress(session, job_id)
    job = session.execute(select(Job.status, Job.cancel_requested).where(Job.id == job_id)).first()
    return job is None or job.status != JobStatus.RUNNING or bool(job.cancel_requested)


def finish(
    session: Session,
    model: WorkModel,
    row_id: str,
    *,
    worker: str,
    status: JobStatus,
    result: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    timings: dict[str, Any] | None = None,
    artifacts: dict[str, Any] | None = None,
) -> bool:
    """running -> a terminal status, only for the worker that holds the work. ``result`` is a job's result or a
    chunk's output (kept only on success); a chunk has no artifacts."""
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"not a terminal status: {status}")
    values: dict[str, Any] = {"status": status, "finished_at": utcnow(), "error": error}
    if model is Job:
        if status == JobStatus.SUCCEEDED:
            values.update(progress=1.0, stage="done", result=result)
        if timings is not None:
            values["timings"] = timings
        if artifacts is not None:
            values["artifacts"] = artifacts
    else:
        values["timings"] = timings or {}
        if status == JobStatus.SUCCEEDED:
            values.update(output=result, progress=1.0)
    if not _update(session, model, _held_by(model, row_id, worker), values):
        return False
    if model is Job:
        finish_event(session, row_id, status, error)
    elif (job_id := _job_of(session, row_id)) is not None:
        update_job_progress(session, job_id)
    return True


def finish_event(session: Session, job_id: str, status: JobStatus | str, error: dict[str, Any] | None) -> None:
    """The job's event of its end."""
    status = JobStatus(status)
    if status == JobStatus.FAILED:
        error = error or {}
        add_event(session, job_id, EventType.FAILED,
                  f"failed: {error.get('code') or error.get('type', 'error')}: {error.get('message', '')}",
                  level=EventLevel.ERROR, data={key: error[key] for key in ("code", "type") if key in error})
    else:
        add_event(session, job_id, EventType(status.value), str(status.value))


def finish_once(session: Session, model: WorkModel, row_id: str, *, worker: str, status: JobStatus,
                **values: Any) -> bool:
    """:func:`finish` as a retried call: True also where an earlier try was committed before the connection
    dropped under it (the work already ended with ``status`` in ``worker``'s hands)."""
    return (finish(session, model, row_id, worker=worker, status=status, **values)
            or finished_by(session, model, row_id, worker=worker, status=status))


def finished_by(session: Session, model: WorkModel, row_id: str, *, worker: str, status: JobStatus) -> bool:
    """Whether the work already ended with ``status`` in the hands of ``worker``: how a retried :func:`finish`
    learns that its earlier try was committed before the connection dropped under it."""
    row = session.execute(select(model.status, model.worker).where(model.id == row_id)).first()
    return row is not None and row.status == status and row.worker == worker


def release(session: Session, model: WorkModel, row_id: str, *, worker: str, stage: str) -> bool:
    """running -> queued for the worker that holds the work, which stops without the run having failed.

    The attempt is given back (a stopped worker is not a failed run, so it must not count towards
    ``max_attempts``) and the row says a message is being sent now. A job whose cancel was requested is
    not released: the caller finishes it as cancelled instead."""
    conditions = _held_by(model, row_id, worker)
    values: dict[str, Any] = {"status": JobStatus.QUEUED, "worker": None, "attempts": model.attempts - 1,
                              "progress": 0.0, "enqueued_at": utcnow()}
    if model is Job:
        conditions += (Job.cancel_requested.is_(False),)
        values["stage"] = stage[:200]
    if not _update(session, model, conditions, values):
        return False
    if model is Job:
        add_event(session, row_id, EventType.REQUEUED, stage[:200], level=EventLevel.WARNING, data={"worker": worker})
    return True


def stale_running(session: Session, model: WorkModel, *, stale_after: timedelta,
                  now: datetime | None = None) -> list[Any]:
    """Running work whose worker went silent. A job fanned out into chunks is held by no worker process: the
    reaper watches its chunks instead."""
    cutoff = (now or utcnow()) - stale_after
    conditions = [model.status == JobStatus.RUNNING, model.heartbeat_at < cutoff]
    if model is Job:
        conditions.append(or_(Job.worker.is_(None), ~Job.worker.startswith(FANOUT_WORKER_PREFIX)))
    return list(session.scalars(select(model).where(*conditions)).all())


def requeue_or_fail_stale(session: Session, row: Work, *, max_attempts: int,
                          outcome_kept: bool = False) -> JobStatus | None:
    """Return work whose worker went silent to the queue (a chunk alone: its job and the other chunks run on),
    or fail it when its attempts are spent; a job whose cancel was requested ends cancelled.

    ``outcome_kept``: an earlier run computed the job's outcome but could not store it (it is on disk, see
    ``store.artifacts.save_pending_outcome``): the job goes back to the queue whatever its attempts, since
    its next run stores that outcome without computing. Returns the new status, or None when another party
    changed the row first."""
    is_job = isinstance(row, Job)
    what = "this job" if is_job else f"chunk {row.chunk_index} of this job"
    values: dict[str, Any]
    if is_job and row.cancel_requested:
        new_status, values = JobStatus.CANCELLED, {"finished_at": utcnow(), "stage": "cancelled (worker lost)"}
    elif row.attempts >= max_attempts and not outcome_kept:
        new_status = JobStatus.FAILED
        values = {"finished_at": utcnow(), "error": {
            "type": "WorkerLost", "code": "worker_lost",
            "message": f"the worker running {what} stopped responding {row.attempts} time(s); giving up",
        }}  # fmt: skip
    else:
        new_status = JobStatus.QUEUED
        values = {"worker": None, "progress": 0.0, "enqueued_at": utcnow()}
        if is_job:
            values["stage"] = "requeued after a lost worker"
    model = type(row)
    conditions = (model.id == row.id, model.status == JobStatus.RUNNING, model.heartbeat_at == row.heartbeat_at)
    if not _update(session, model, conditions, {"status": new_status, **values}):
        return None
    if isinstance(row, JobChunk):
        requeued = new_status == JobStatus.QUEUED
        add_event(session, row.job_id, EventType.REQUEUED if requeued else EventType.WARNING,
                  f"chunk {row.chunk_index}: the worker running attempt {row.attempts} stopped responding; "
                  f"{'requeued alone' if requeued else 'failed'}",
                  level=EventLevel.WARNING, data={"chunk": row.chunk_index, "worker": row.worker})
    elif new_status == JobStatus.FAILED:
        finish_event(session, row.id, new_status, values["error"])
    elif new_status == JobStatus.CANCELLED:
        add_event(session, row.id, EventType.CANCELLED, "cancelled (its worker was lost)")
    else:
        add_event(session, row.id, EventType.REQUEUED, f"requeued: the worker running attempt {row.attempts} stopped "
                  "responding", level=EventLevel.WARNING, data={"attempt": row.attempts, "worker": row.worker})
    return new_status


def _not_sent_since(model: WorkModel, cutoff: datetime) -> Any:
    # Job rows from before migration 0002 have no enqueued_at: their creation is the last send we know of.
    return (func.coalesce(Job.enqueued_at, Job.created_at) if model is Job else JobChunk.enqueued_at) < cutoff


def on_queue(model: WorkModel, queue: str) -> Any:
    """The condition: the work is of ``queue``."""
    # Job rows from before migration 0002 have no queue: they were sent to the one queue the service used.
    return or_(Job.queue == queue, Job.queue.is_(None)) if model is Job else JobChunk.queue == queue


def lost_queued(session: Session, model: WorkModel, *, queue: str, not_sent_for: timedelta) -> list[str]:
    """Ids of the queued work of ``queue`` whose last message was sent longer than ``not_sent_for`` ago."""
    cutoff = utcnow() - not_sent_for
    return list(session.scalars(
        select(model.id).where(model.status == JobStatus.QUEUED, on_queue(model, queue),
                               _not_sent_since(model, cutoff))
    ).all())  # fmt: skip


def mark_resent(session: Session, model: WorkModel, row_id: str, *, queue: str, not_sent_for: timedelta) -> bool:
    """Stamp a new send time on queued work still unsent for ``not_sent_for``; False when someone else
    (another worker's reaper, a claim, a cancel) got there first, so only one party sends the message."""
    cutoff = utcnow() - not_sent_for
    conditions = (model.id == row_id, model.status == JobStatus.QUEUED, on_queue(model, queue),
                  _not_sent_since(model, cutoff))
    values: dict[str, Any] = {"enqueued_at": utcnow()}
    if model is Job:
        values["queue"] = queue
    if not _update(session, model, conditions, values):
        return False
    if model is Job:
        add_event(session, row_id, EventType.RESENT, "its queue message was lost; sent again", level=EventLevel.WARNING)
    return True
