"""The worker's :class:`kernels.progress.Progress`: progress to the job's (or the chunk's) row, cancellation,
artifacts, the time limit's checkpoint, the heartbeat, and the stop flag a warm shutdown raises so running work
hands itself back to the queue."""

from __future__ import annotations

import threading
import time
from typing import Any

import structlog

from kernels.progress import JobCancelled
from store import work
from store.artifacts import save_artifact
from store.db import session_scope
from store.events import EventType, add_event
from store.models import Job, JobChunk
from worker.infra import InfrastructureUnavailable, describe, retry_infrastructure
from worker.time_limit import Deadline

log = structlog.get_logger("gpuest.worker")

# A progress write is retried briefly (a dropped connection is back at the second try), then skipped:
# writes then pause for PROGRESS_PAUSE_SECONDS, doubling while the outage lasts, up to the maximum.
PROGRESS_RETRY_SECONDS = 1.0
PROGRESS_PAUSE_SECONDS = 1.0
PROGRESS_PAUSE_MAX_SECONDS = 30.0
# A job's log keeps its first stage changes only: a kernel that names every iteration a stage must not
# write thousands of lines.
MAX_STAGE_EVENTS = 200


class WorkerStopping(Exception):
    """Raised at a progress checkpoint once this worker process began a warm shutdown."""


# Set from Celery's worker_shutting_down signal (worker.tasks), in the process that runs the job: with the
# solo pool the signal handler and the job share the main thread, so the job sees it at its next checkpoint.
worker_stopping = threading.Event()


class JobProgress:
    """Writes progress at most every ``min_interval`` seconds and raises :class:`JobCancelled` once the
    job was asked to stop (or was taken from this worker by the reaper; for a chunk, ``model`` JobChunk: once
    its job was cancelled or has ended), or :class:`WorkerStopping` at the
    first checkpoint after the worker began shutting down, :class:`~worker.time_limit.TimeLimitExceeded` at the
    first checkpoint past the job's soft time limit (``deadline``)."""

    def __init__(self, job_id: str, worker: str, min_interval: float = 0.5, deadline: Deadline | None = None,
                 model: work.WorkModel = Job) -> None:
        self.job_id = job_id  # the chunk's id for a chunk
        self.model = model
        self.worker = worker
        self.min_interval = min_interval
        self.deadline = deadline or Deadline(None)
        self.artifacts: dict[str, Any] = {}
        self._last_write = 0.0
        self._quiet_until = 0.0  # no progress writes before this (monotonic) time: the database is away
        self._failures = 0  # progress writes given up in a row
        self._logged_stage: str | None = None  # the last stage written to the job's events
        self._stage_events = 0

    def __call__(self, fraction: float, stage: str | None = None) -> None:
        if fraction >= 1.0:
            # The final report (run_kind's "done") comes once the result exists: job_store.finish writes
            # progress 1.0 and stage "done" anyway, and a checkpoint here would let a late cancel or a warm
            # shutdown throw the computed result away.
            return
        # Before the rate limit: a shutdown has a grace period, and every checkpoint may be the last in it.
        if worker_stopping.is_set():
            raise WorkerStopping(f"worker stopping; {self._what} goes back to the queue")
        self.deadline.check()
        now = time.monotonic()
        if now - self._last_write < self.min_interval or now < self._quiet_until:
            return
        self._last_write = now
        try:
            stop = retry_infrastructure(lambda: self._write(float(fraction), stage), what="record progress",
                                        budget_seconds=PROGRESS_RETRY_SECONDS, job_id=self.job_id)
        except InfrastructureUnavailable:
            # Progress is a report, not the job: the kernel goes on. Writes pause for a while (growing while
            # the outage lasts), so the kernel does not wait on every checkpoint.
            self._failures += 1
            pause = min(PROGRESS_PAUSE_MAX_SECONDS, PROGRESS_PAUSE_SECONDS * 2 ** (self._failures - 1))
            self._quiet_until = time.monotonic() + pause
            log.warning("progress not recorded: database unavailable; the job goes on", job_id=self.job_id,
                        pause_seconds=pause)
            return
        self._failures = 0
        if stop:
            raise JobCancelled(f"job {self.job_id} was cancelled" if self.model is Job
                               else f"{self._what}: its job was cancelled or has ended")

    @property
    def _what(self) -> str:
        return f"{'job' if self.model is Job else 'chunk'} {self.job_id}"

    def _write(self, fraction: float, stage: str | None) -> bool:
        with session_scope() as session:
            stop = work.record_progress(session, self.model, self.job_id, worker=self.worker, progress=fraction,
                                        stage=stage)
            # a chunk's stages are its job's business: only a job's are logged
            log_stage = (self.model is Job and stage is not None and stage != self._logged_stage
                         and self._stage_events < MAX_STAGE_EVENTS)
            if log_stage and not stop:
                add_event(session, self.job_id, EventType.STAGE, str(stage)[:200],
                          data={"progress": round(fraction, 4)})
        if log_stage and not stop:  # only once committed: a retried write logs its stage once
            self._logged_stage, self._stage_events = stage, self._stage_events + 1
        return stop

    def save_artifact(self, name: str, value: Any) -> None:
        if self.model is JobChunk:
            raise NotImplementedError("a chunk of a fanned-out job saves no artifacts")
        self.artifacts[name] = save_artifact(self.job_id, name, value)


class Heartbeat:
    """A daemon thread that stamps the job's (or, ``model`` JobChunk, the chunk's) heartbeat while the kernel
    computes (even inside one long call)."""

    def __init__(self, job_id: str, worker: str, interval: float, model: work.WorkModel = Job) -> None:
        self._job_id, self._worker, self._interval, self._model = job_id, worker, interval, model
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{job_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """No more beats (the job ended, or ran past its hard time limit)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _stamp(self) -> None:
        with session_scope() as session:
            work.heartbeat(session, self._model, self._job_id, worker=self._worker)

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                # Retried within the interval: a dropped connection must not cost a beat, or a few in a row
                # would make the job look lost to the reaper.
                retry_infrastructure(self._stamp, what="heartbeat", budget_seconds=self._interval,
                                     job_id=self._job_id)
            except Exception as exc:  # a longer outage or any other error must not kill the beat
                log.warning("heartbeat not recorded", job_id=self._job_id, error=describe(exc.__cause__ or exc))
                continue
