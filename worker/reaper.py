"""The reaper: one loop over all work, jobs and the chunks of fanned-out jobs alike (store/work.py).

Work whose worker stopped heartbeating goes back to its queue (a chunk alone: its job and the other chunks run
on) or fails once its attempts are spent. While this worker has been idle for a reaper interval, queued work of
its queue whose last message is older than the stale limit has lost that message (an idle worker would have
taken it): it is sent once more and its send time updated, so the next pass leaves it alone. Only one claim can
win, so an extra message is harmless anyway. Then the fanned-out jobs whose chord callback was lost are reduced,
the decoded copies of deleted datasets pruned and the finished jobs past their retention deleted.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import structlog

from core.queue import send
from core.settings import get_settings
from core.status import JobPriority, JobStatus
from store import jobs as job_store
from store import work
from store.artifacts import load_pending_outcome
from store.db import session_scope
from store.decoded import prune_decoded_copies
from store.models import Job, JobChunk
from worker import fanout
from worker.health import touch
from worker.infra import describe, forget_dead_connections, is_infrastructure_error

log = structlog.get_logger("gpuest.worker")


class Activity:
    """Whether this worker process runs a job, and for how long it has been idle (read by the reaper)."""

    def __init__(self) -> None:
        self._running = False
        self._idle_since = time.monotonic()

    def started(self) -> None:
        self._running = True

    def finished(self) -> None:
        self._running, self._idle_since = False, time.monotonic()

    def idle_for(self) -> float:
        return 0.0 if self._running else time.monotonic() - self._idle_since


activity = Activity()


def reap_once() -> dict[str, int]:
    """One reaper pass; returns how many of each it did."""
    settings = get_settings()
    stale_after = timedelta(seconds=settings.stale_after_seconds)
    # Idle for a whole reaper interval, not just between two jobs of a backlog: a waiting message would
    # have been taken by now, so the queued work's messages are the lost ones.
    idle = activity.idle_for() >= settings.reaper_interval_seconds
    counts = reap_work(stale_after, settings.max_attempts, idle, settings.queue)
    with session_scope() as session:  # decoded copies of datasets deleted elsewhere
        counts["decoded_pruned"] = prune_decoded_copies(session)
    if settings.retention_days > 0 or settings.retention_days_by_owner:
        with session_scope() as session:  # retention: finished jobs past their owner's limit, files with them
            expired = job_store.expire_finished_jobs(session, default_days=settings.retention_days,
                                                     days_by_owner=settings.retention_days_by_owner)
        counts["expired"] = len(expired)
        if expired:
            log.info("expired finished jobs", count=len(expired), first=expired[0])
    return counts


def reap_work(stale_after: timedelta, max_attempts: int, idle: bool, queue: str,
              models: Sequence[work.WorkModel] = (Job, JobChunk)) -> dict[str, int]:
    """Re-queue (or fail) the stale work of ``models``, re-send its lost messages when ``idle``, and reduce the
    fanned-out jobs whose chord callback was lost. Counts per model: ``requeued``, ``failed``, ``cancelled``,
    ``resent`` for jobs, the same prefixed ``chunks_`` for chunks, and ``reduced``."""
    counts: dict[str, int] = {}
    for model in models:
        prefix = "" if model is Job else "chunks_"
        counts.update({f"{prefix}{name}": 0 for name in ("requeued", "failed", "resent")})
        if model is Job:
            counts["cancelled"] = 0
        for outcome in _requeue_stale(model, stale_after, max_attempts, queue):
            name = "requeued" if outcome == JobStatus.QUEUED else outcome.value
            counts[f"{prefix}{name}"] = counts.get(f"{prefix}{name}", 0) + 1
        if idle:
            counts[f"{prefix}resent"] = _resend_lost_messages(model, queue, stale_after)
    if JobChunk in models:
        counts["reduced"] = fanout.reduce_lost_callbacks(stale_after)
    return counts


def _requeue_stale(model: work.WorkModel, stale_after: timedelta, max_attempts: int,
                   queue: str) -> list[JobStatus]:
    """The stale work of ``model`` re-queued (and its message sent) or failed; a chunk's failure fails its job.
    A job's re-send keeps its priority; a computed outcome kept on disk is never thrown away for the attempts
    spent storing it."""
    with session_scope() as session:
        reaped = []
        for row in work.stale_running(session, model, stale_after=stale_after):
            kept = isinstance(row, Job) and load_pending_outcome(row.id) is not None
            outcome = work.requeue_or_fail_stale(session, row, max_attempts=max_attempts, outcome_kept=kept)
            if outcome is not None:
                reaped.append((row.id, row.job_id if isinstance(row, JobChunk) else row.id, row.queue,
                               getattr(row, "priority", None), outcome))
    for row_id, job_id, row_queue, priority, outcome in reaped:
        if model is Job:
            log.warning("reaped job of a lost worker", job_id=job_id, outcome=outcome)
            if outcome == JobStatus.QUEUED:
                _send_or_leave(job_id, row_queue or queue, _as_priority(priority))
        else:
            log.warning("reaped a chunk of a lost worker", job_id=job_id, chunk_id=row_id, outcome=outcome)
            if outcome == JobStatus.QUEUED:
                fanout.resend_queued(row_id)
            else:
                fanout.settle(job_id)
    return [outcome for *_row, outcome in reaped]


def _resend_lost_messages(model: work.WorkModel, queue: str, not_sent_for: timedelta) -> int:
    with session_scope() as session:
        candidates = work.lost_queued(session, model, queue=queue, not_sent_for=not_sent_for)
    resent = 0
    for row_id in candidates:
        with session_scope() as session:
            # Conditional: of several idle workers on this queue, one re-sends.
            if not work.mark_resent(session, model, row_id, queue=queue, not_sent_for=not_sent_for):
                continue
            priority = job_store.priority_of(session, row_id) if model is Job else None
        if priority is None:
            fanout.resend_queued(row_id)
            resent += 1
        elif _send_or_leave(row_id, queue, priority):
            log.info("re-sent the message of a queued job", job_id=row_id, queue=queue)
            resent += 1
    return resent


def _as_priority(value: str | None) -> JobPriority:
    try:
        return JobPriority(value or JobPriority.NORMAL)
    except ValueError:
        return JobPriority.NORMAL


def _send_or_leave(job_id: str, queue: str, priority: JobPriority = JobPriority.NORMAL) -> bool:
    """Send a queued job's message; on a broker error, log it: the row says it was sent now, so a later
    reaper pass sends it again once it is older than the stale limit."""
    try:
        send(job_id, queue=queue, priority=priority)
    except Exception as exc:
        log.error("could not send a job's message; a later reaper pass re-sends it", job_id=job_id,
                  error=describe(exc))
        return False
    return True


def reaper_loop(interval: float, alive_file: Path | None) -> None:
    """The reaper's thread: a pass every ``interval`` seconds, touching ``alive_file`` after each."""
    while True:
        time.sleep(interval)
        try:
            reap_once()
        except Exception as exc:
            if is_infrastructure_error(exc):  # the next pass retries; no traceback for an outage
                forget_dead_connections(exc)
                log.warning("reaper pass skipped: database unavailable", error=describe(exc))
            else:
                log.error("reaper pass failed", traceback=traceback.format_exc())
            continue
        if alive_file is not None:
            touch(alive_file)  # the container healthcheck (worker.health) reads its age
