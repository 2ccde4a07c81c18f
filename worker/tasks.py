"""The Celery task that runs one job, the reaper that rescues jobs of lost workers, and the worker's
start and warm-shutdown hooks. Start a worker with ``celery -A worker.tasks:celery_app worker ...``.

The message carries only the job id. A claim is a conditional UPDATE (queued -> running), so a
redelivered or duplicated message for a job already claimed or finished does nothing. The worker makes the
job's run context (array namespace, progress and cancel, dataset loading, artifacts) and hands it to
:func:`kernels.context.run_kind`, which stamps the device and the stage timings on the result.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import structlog
from celery.signals import worker_init, worker_ready, worker_shutting_down
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

import core.queue
from core.logging import configure_worker_logging
from core.queue import RUN_JOB_TASK, send
from core.settings import get_settings
from core.status import JobStatus
from kernels import backend, cuda
from kernels.backend import GPUUnavailableError, device_label
from kernels.context import DatasetLoader, RunContext, namespace_for, run_kind
from kernels.progress import JobCancelled
from kernels.registry import JobKind, get_kind, registry
from store import jobs as job_store
from store.datasets import get_dataset, load_frame
from store.db import session_scope
from store.migrate import SchemaNotMigratedError, ensure_migrated
from store.models import Job, utcnow
from worker.health import touch
from worker.progress import Heartbeat, JobProgress, WorkerStopping, worker_stopping

if TYPE_CHECKING:
    import pandas as pd

log = structlog.get_logger("gpuest.worker")

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
# CuPy's on-disk cache of compiled kernels, under the data directory: a restarted worker loads them.
CUDA_CACHE_DIR_NAME = "cuda-cache"

celery_app = core.queue.get_celery_app()


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


_activity = Activity()
REQUEUED_STAGE = "requeued: worker stopped"
# Exit status of a worker that refuses to start (EX_CONFIG of sysexits.h: a configuration problem).
EXIT_NOT_READY = 78


@celery_app.task(name=RUN_JOB_TASK)
def run_job(job_id: str) -> str | None:
    _activity.started()
    try:
        status = execute_job(job_id)
        return None if status is None else status.value
    finally:
        _activity.finished()


def _seconds_between(start: Any, end: Any) -> float | None:
    if start is None or end is None:
        return None
    return (end.replace(tzinfo=None) - start.replace(tzinfo=None)).total_seconds()


@dataclass(frozen=True)
class Placement:
    """Where a job runs, chosen before its claim so that the device its row records is the one it runs on.

    ``kind`` is None for an unknown kind name and ``xp`` None for an unusable device; ``error`` then says
    why the job fails instead of running."""

    kind: JobKind | None = None
    xp: ModuleType | None = None
    error: Exception | None = None

    @property
    def device(self) -> str:
        return "unavailable" if self.xp is None else device_label(self.xp)


def place(kind_name: str) -> Placement:
    try:
        kind: JobKind | None = get_kind(kind_name)
        kind_error: KeyError | None = None
    except KeyError as exc:  # the job fails with it; its row records the worker's default device
        kind, kind_error = None, exc
    try:
        xp = namespace_for(kind) if kind is not None else backend.get_namespace()
    except (GPUUnavailableError, ValueError) as exc:  # GPUEST_DEVICE=gpu without a GPU, or a bad value
        # An unknown kind is the job's own error: report it rather than the device's.
        return Placement(kind, None, kind_error or exc)
    return Placement(kind, xp, kind_error)


def execute_job(job_id: str, worker: str = WORKER_ID) -> JobStatus | None:
    """Claim and run one job to a terminal status; returns that status, ``queued`` when a warm shutdown of
    this worker handed the job back to the queue, or None if it was not ours to run."""
    settings = get_settings()
    if worker_stopping.is_set():
        pass_on(job_id)
        return None
    with session_scope() as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.QUEUED:
            log.info("job not claimed", job_id=job_id)
            return None
        placement = place(job.kind)
        started_at = utcnow()
        # The conditional UPDATE is the real guard: another claim or a cancel may have come since the read.
        if not job_store.claim(session, job_id, worker=worker, device=placement.device, now=started_at):
            log.info("job not claimed", job_id=job_id)
            return None
        kind_name, queue = job.kind, job.queue
        params, dataset_ids = dict(job.params), dict(job.dataset_ids)
        queue_wait = _seconds_between(job.created_at, started_at)
    log.info("job started", job_id=job_id, kind=kind_name, worker=worker)

    progress = JobProgress(job_id, worker)
    started = time.perf_counter()
    with Heartbeat(job_id, worker, settings.heartbeat_seconds):
        status, result, error = _run(job_id, placement, params, dataset_ids, progress)
    run_seconds = time.perf_counter() - started
    if status == JobStatus.QUEUED:
        if hand_back(job_id, worker, queue):
            log.info("job handed back to the queue: worker stopping", job_id=job_id, run_seconds=round(run_seconds, 3))
            return JobStatus.QUEUED
        status = JobStatus.CANCELLED  # not released: its cancel was requested meanwhile (or it is no longer ours)
    with session_scope() as session:
        finished = job_store.finish(
            session,
            job_id,
            worker=worker,
            status=status,
            result=result,
            error=error,
            # Worker-side seconds only: the kernel's per-stage timings are in the result (result["timings"]).
            timings={"queue_wait": queue_wait, "run": run_seconds},
            artifacts=progress.artifacts,
        )
    log.info("job finished", job_id=job_id, status=status, recorded=finished, run_seconds=round(run_seconds, 3))
    return status if finished else None


def _run(
    job_id: str,
    placement: Placement,
    params: dict[str, Any],
    dataset_ids: dict[str, str],
    progress: JobProgress,
) -> tuple[JobStatus, dict[str, Any] | None, dict[str, Any] | None]:
    """Run the claimed job: (status, result, error), where status ``queued`` means this worker began a warm
    shutdown and the job is to be handed back."""
    try:
        if placement.error is not None:
            raise placement.error
        assert placement.kind is not None and placement.xp is not None
        if worker_stopping.is_set():  # the shutdown began between the message and the claim
            raise WorkerStopping(f"worker stopping; job {job_id} goes back to the queue")
        ctx = RunContext(placement.xp, progress, dataset_loader(dataset_ids), dataset_fields=tuple(dataset_ids))
        return JobStatus.SUCCEEDED, run_kind(placement.kind, params, ctx), None
    except WorkerStopping:
        return JobStatus.QUEUED, None, None
    except JobCancelled:
        return JobStatus.CANCELLED, None, None
    except (ValueError, ValidationError, KeyError, GPUUnavailableError) as exc:
        return _failed(type(exc).__name__, str(exc))
    except MemoryError:
        return _failed("OutOfMemory", "the job needed more memory than the worker has")
    except Exception as exc:
        log.error("job raised", job_id=job_id, traceback=traceback.format_exc())
        return _failed(type(exc).__name__, str(exc) or "internal error in the kernel")


def _failed(error_type: str, message: str) -> tuple[JobStatus, None, dict[str, Any]]:
    # What the user sees: a stable type and a short message (the traceback goes to the log only).
    return JobStatus.FAILED, None, {"type": error_type, "message": message}


def dataset_loader(dataset_ids: Mapping[str, str]) -> DatasetLoader:
    """Loads the dataset a params field names, when the runner first asks for it (``ctx.dataset(field)``)."""

    def load(field: str) -> pd.DataFrame:
        dataset_id = dataset_ids[field]
        with session_scope() as session:
            dataset = get_dataset(session, dataset_id)
            if dataset is None:
                raise ValueError(f"{field}: dataset {dataset_id} no longer exists")
            path = dataset.path  # read while the session is open, not on a detached instance
        return load_frame(path)

    return load


def hand_back(job_id: str, worker: str, queue: str | None) -> bool:
    """Release a job this stopping worker holds (running -> queued, the attempt given back) and send it
    again at once to ``queue`` (the job's), so the next worker on it runs the job without waiting for the
    reaper."""
    with session_scope() as session:
        released = job_store.release(session, job_id, worker=worker, stage=REQUEUED_STAGE)
    if not released:
        return False
    try:
        send(job_id, queue=queue)
    except Exception:  # the row says it is queued and when it was sent: a reaper pass re-sends it later
        log.error("could not re-send a released job", job_id=job_id, traceback=traceback.format_exc())
    return True


def pass_on(job_id: str) -> None:
    """A stopping worker can still be handed a message (often the one its own hand-back just sent): send
    it on to the job's queue unclaimed, for the next worker, instead of claiming and releasing the job."""
    with session_scope() as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.QUEUED:
            return  # nothing to run here: a claim would have failed too
        queue = job.queue
        job_store.mark_enqueued(session, job_id)
    send(job_id, queue=queue)
    log.info("worker stopping: passed a job's message on unclaimed", job_id=job_id)


def reap_once() -> dict[str, int]:
    """Rescue jobs whose worker stopped heartbeating; re-send lost messages of this worker's queue.

    A stale running job goes back to its own queue (or fails once its attempts are spent). While this
    worker has been idle for a reaper interval, a job queued on its queue whose last message is older than
    the stale limit has lost that message (an idle worker would have taken it): it is sent once more and
    its send time updated, so the next pass leaves it alone. Only one claim can win, so an extra message
    is harmless anyway.
    """
    settings = get_settings()
    stale_after = timedelta(seconds=settings.stale_after_seconds)
    counts = {"requeued": 0, "failed": 0, "cancelled": 0, "resent": 0}
    with session_scope() as session:
        outcomes = [
            (job.id, job.queue, job_store.requeue_or_fail_stale(session, job, max_attempts=settings.max_attempts))
            for job in job_store.stale_running_jobs(session, stale_after=stale_after)
        ]
    for job_id, queue, outcome in outcomes:
        if outcome is None:
            continue
        counts["requeued" if outcome == JobStatus.QUEUED else outcome.value] += 1
        log.warning("reaped job of a lost worker", job_id=job_id, outcome=outcome)
        if outcome == JobStatus.QUEUED:
            send(job_id, queue=queue or settings.queue)
    # Idle for a whole reaper interval, not just between two jobs of a backlog: a waiting message would
    # have been taken by now, so the queued jobs' messages are the lost ones.
    if _activity.idle_for() >= settings.reaper_interval_seconds:
        counts["resent"] = _resend_lost_messages(settings.queue, stale_after)
    return counts


def _resend_lost_messages(queue: str, not_sent_for: timedelta) -> int:
    with session_scope() as session:
        candidates = job_store.queued_job_ids(session, queue=queue, not_sent_for=not_sent_for)
    resent = 0
    for job_id in candidates:
        with session_scope() as session:
            # Conditional: of several idle workers on this queue, one re-sends.
            if not job_store.mark_resent(session, job_id, queue=queue, not_sent_for=not_sent_for):
                continue
        send(job_id, queue=queue)
        log.info("re-sent the message of a queued job", job_id=job_id, queue=queue)
        resent += 1
    return resent


def _reaper_loop(interval: float, alive_file: Path | None) -> None:
    while True:
        time.sleep(interval)
        try:
            reap_once()
        except Exception:
            log.error("reaper pass failed", traceback=traceback.format_exc())
            continue
        if alive_file is not None:
            touch(alive_file)  # the container healthcheck (worker.health) reads its age


def refuse_to_start(reason: str) -> None:
    """One line on the real stderr (Celery has not redirected it yet) and a non-zero exit."""
    print(f"gpuest worker: refusing to start: {reason}", file=sys.__stderr__, flush=True)
    raise SystemExit(EXIT_NOT_READY)


@worker_init.connect
def _prepare_worker(**_kwargs: Any) -> None:
    """In the worker's main process before it consumes: logging, the schema check, the kernel modules."""
    configure_worker_logging()
    try:
        ensure_migrated()
    except SchemaNotMigratedError as exc:
        refuse_to_start(str(exc))
    except SQLAlchemyError as exc:
        refuse_to_start(f"cannot read the database schema: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    # Import every kernel module now rather than inside the first job (seconds of SciPy and pandas imports
    # that would otherwise count as that job's run time, in stage "starting"). Declaring a CUDA source
    # compiles nothing, so the disk cache below is still in place before the first compile.
    registry()
    warm_up_gpu(get_settings().data_dir / CUDA_CACHE_DIR_NAME)


def warm_up_gpu(cache_dir: Path) -> None:
    """On a worker that computes on a GPU: keep compiled kernels in ``cache_dir`` (before anything compiles),
    then compile every kernel variant jobs commonly use, so the first job pays no NVRTC compile. A failed
    warm-up is logged and the worker serves anyway: its jobs then compile on demand. Nothing runs on CPU."""
    try:
        xp = backend.get_namespace()
    except (GPUUnavailableError, ValueError):
        return  # no usable device: every job fails with the reason, there is nothing to warm
    if backend.is_numpy(xp):
        return
    if not os.environ.get("CUPY_CACHE_DIR"):  # an operator's own cache directory wins
        cuda.use_disk_cache(cache_dir)
    started = time.perf_counter()
    try:
        modules = cuda.warm_up()
    except Exception:
        log.error("kernel warm-up failed; jobs compile their kernels on demand", traceback=traceback.format_exc())
        return
    log.info("kernels warmed up", modules=modules, seconds=round(time.perf_counter() - started, 3),
             cache_dir=str(cache_dir))


@worker_shutting_down.connect
def _stop_running_job(**_kwargs: Any) -> None:
    # Runs in the signal handler of the main process (the solo pool's job thread): only set a flag, which
    # the job's next progress checkpoint turns into WorkerStopping.
    worker_stopping.set()


@worker_ready.connect
def _start_reaper(**_kwargs: Any) -> None:
    settings = get_settings()
    if settings.worker_alive_file is not None:
        touch(settings.worker_alive_file)
    threading.Thread(
        target=_reaper_loop, args=(settings.reaper_interval_seconds, settings.worker_alive_file),
        name="gpuest-reaper", daemon=True,
    ).start()
    log.info("worker ready", worker=WORKER_ID, device=_default_device(), queue=settings.queue)


def _default_device() -> str:
    try:
        return device_label(backend.get_namespace())
    except (GPUUnavailableError, ValueError):
        return "unavailable"
