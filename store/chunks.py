"""Chunks of a job fanned out over workers: a row per part of the job's Celery chord, work with a parent. Their
lifecycle (claim, progress, heartbeat, finish, release, re-queue, re-send) is the jobs' one, store/work.py; this
module holds what only a fan-out has: the hand-over of a job to its chunks and back, its chunks' reads, the job's
progress as its chunks' mean.

The parent job stays ``running`` while its chunks run, held by the marker worker ``chunks:<group id>``
instead of a worker process: its own heartbeat is not watched (the reaper watches the chunks'), and the
reduction that ends it finishes it as that marker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, defer

from core.status import TERMINAL_STATUSES, JobStatus
from store.events import EventType, add_event
from store.models import Job, JobChunk, new_id, utcnow

FANOUT_WORKER_PREFIX = "chunks:"


def fanout_worker(group_id: str) -> str:
    """The worker name a fanned-out job is held by while its chunks run."""
    return f"{FANOUT_WORKER_PREFIX}{group_id}"


@dataclass(frozen=True)
class ChunkPlan:
    """A chunk to create: its spec, and its output when it is already computed (the lead), with the stage
    timings of that computation (the job's result adds every chunk's)."""

    spec: dict[str, Any]
    output: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)


def fan_out(
    session: Session, job_id: str, *, worker: str, group_id: str, device: str, queue: str, chunks: Sequence[ChunkPlan]
) -> list[str] | None:
    """Hand a running job from ``worker`` to its chunks: the job is then held by :func:`fanout_worker`, the
    chunks with an output are succeeded (computed by ``worker`` on ``device``), the others queued for
    ``queue``. Returns the chunk ids in order, or None when the job is no longer ``worker``'s (cancelled or
    reaped meanwhile: nothing is created)."""
    now = utcnow()
    held = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker == worker, Job.cancel_requested.is_(False))
        .values(worker=fanout_worker(group_id), heartbeat_at=now, stage=f"chunks 0/{len(chunks)}")
        .execution_options(synchronize_session=False)
    ).rowcount
    if held != 1:
        return None
    ids = []
    for index, plan in enumerate(chunks):
        done = plan.output is not None
        chunk = JobChunk(
            id=new_id(), job_id=job_id, chunk_index=index, group_id=group_id, spec=plan.spec,
            status=JobStatus.SUCCEEDED if done else JobStatus.QUEUED, attempts=1 if done else 0,
            worker=worker if done else None, device=device if done else None, progress=1.0 if done else 0.0,
            queue=queue, enqueued_at=now, started_at=now if done else None, finished_at=now if done else None,
            output=plan.output, timings=dict(plan.timings),
        )  # fmt: skip
        session.add(chunk)
        ids.append(chunk.id)
    session.flush()
    add_event(session, job_id, EventType.STAGE, f"fanned out into {len(chunks)} chunks",
              data={"chunks": len(chunks), "group_id": group_id})
    return ids


def chunks_of(session: Session, job_id: str, *, outputs: bool = True) -> list[JobChunk]:
    """The job's chunks in order. ``outputs=False`` leaves each chunk's output unread until it is used (a chunk
    of an SCCS bootstrap holds megabytes of fits, and every chunk's worker reads its job's chunks when it ends:
    only the last one needs the outputs)."""
    query = select(JobChunk).where(JobChunk.job_id == job_id).order_by(JobChunk.chunk_index)
    if not outputs:
        query = query.options(defer(JobChunk.output))
    return list(session.scalars(query))


def is_fanned_out(session: Session, job_id: str) -> bool:
    return session.scalar(select(func.count()).select_from(JobChunk).where(JobChunk.job_id == job_id)) != 0


def update_job_progress(session: Session, job_id: str) -> None:
    """A fanned-out job's progress: its chunks' mean, weighted by their size (and its heartbeat and stage)."""
    rows = session.execute(select(JobChunk.progress, JobChunk.spec).where(JobChunk.job_id == job_id)).all()
    sizes = [max(1, int((spec or {}).get("size", 1))) for _, spec in rows]
    done = sum(progress * size for (progress, _), size in zip(rows, sizes, strict=True))
    finished = sum(1 for progress, _ in rows if progress >= 1.0)
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker.startswith(FANOUT_WORKER_PREFIX))
        .values(progress=done / max(1, sum(sizes)), heartbeat_at=utcnow(), stage=f"chunks {finished}/{len(rows)}")
        .execution_options(synchronize_session=False)
    )


def settled_fanouts(session: Session, *, settled_for: timedelta) -> list[str]:
    """Running fanned-out jobs whose chunks have all ended longer than ``settled_for`` ago: their reduction
    (the chord's callback) was lost, so a reaper reduces them."""
    cutoff = utcnow() - settled_for
    open_chunks = (
        select(JobChunk.id).where(JobChunk.job_id == Job.id, JobChunk.status.not_in(TERMINAL_STATUSES)).exists()
    )
    last_finish = select(func.max(JobChunk.finished_at)).where(JobChunk.job_id == Job.id).scalar_subquery()
    return list(session.scalars(
        select(Job.id).where(Job.status == JobStatus.RUNNING, Job.worker.startswith(FANOUT_WORKER_PREFIX),
                             ~open_chunks, last_finish < cutoff)
    ).all())  # fmt: skip


def cancel_open_chunks(session: Session, job_id: str) -> int:
    """End a job's queued chunks as cancelled (its reduction found a failed or cancelled chunk)."""
    return session.execute(
        update(JobChunk)
        .where(JobChunk.job_id == job_id, JobChunk.status == JobStatus.QUEUED)
        .values(status=JobStatus.CANCELLED, finished_at=utcnow())
        .execution_options(synchronize_session=False)
    ).rowcount


def hand_to_finish(session: Session, job_id: str, *, worker: str, chunks: int) -> bool:
    """A fanned-out job whose chunks all succeeded goes back to its queue (running -> queued), for a worker to
    finish it from their outputs as a job (a kind whose finish needs the tables and the device: SCCS). The
    attempt is given back (the finishing run's claim counts it again), the row says a message is being sent
    now. False when another party came first or its cancel was requested (the caller then ends it cancelled)."""
    updated = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker == worker,
               Job.cancel_requested.is_(False))
        .values(status=JobStatus.QUEUED, worker=None, attempts=Job.attempts - 1, stage=f"finishing {chunks} chunks",
                enqueued_at=utcnow())
        .execution_options(synchronize_session=False)
    ).rowcount
    if updated == 1:
        add_event(session, job_id, EventType.STAGE, f"its {chunks} chunks succeeded: queued to be finished",
                  data={"chunks": chunks})
    return updated == 1


def delete_chunks(session: Session, job_ids: Sequence[str]) -> None:
    """A deleted job's chunks (SQLite does not enforce the foreign key's cascade)."""
    session.execute(delete(JobChunk).where(JobChunk.job_id.in_(list(job_ids))).execution_options(
        synchronize_session=False))


def running_by_device(session: Session) -> dict[str, int]:
    """Work running now per device, as the workers advertise it: jobs held by a worker process and chunks
    (a fanned-out job is counted by its chunks, on whichever devices they run)."""
    counts: dict[str, int] = {}
    jobs = session.execute(
        select(Job.device, func.count()).where(
            Job.status == JobStatus.RUNNING, ~func.coalesce(Job.worker, "").startswith(FANOUT_WORKER_PREFIX))
        .group_by(Job.device)
    ).all()
    chunks = session.execute(
        select(JobChunk.device, func.count()).where(JobChunk.status == JobStatus.RUNNING).group_by(JobChunk.device)
    ).all()
    for device, count in [*jobs, *chunks]:
        counts[device or "unknown"] = counts.get(device or "unknown", 0) + count
    return counts
