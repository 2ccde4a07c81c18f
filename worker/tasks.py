"""The Celery task that runs one job, and the reaper that rescues jobs of lost workers.

The message carries only the job id. A claim is a conditional UPDATE (queued -> running), so a
redelivered or duplicated message for a job already claimed or finished does nothing.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
import uuid
from datetime import timedelta
from typing import Any

import structlog
from celery.signals import worker_ready
from pydantic import ValidationError

from kernels.backend import GPUUnavailableError, device_label, get_namespace
from kernels.progress import JobCancelled
from kernels.registry import get_kind
from store import jobs as job_store
from store.datasets import get_dataset, load_frame
from store.db import session_scope
from store.models import Job
from store.settings import get_settings
from worker.celery_app import RUN_JOB_TASK, celery_app
from worker.dispatch import enqueue_job
from worker.progress import Heartbeat, JobProgress

log = structlog.get_logger("gpuest.worker")

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
_busy = threading.Event()


@celery_app.task(name=RUN_JOB_TASK)
def run_job(job_id: str) -> str | None:
    _busy.set()
    try:
        return execute_job(job_id)
    finally:
        _busy.clear()


def _seconds_between(start: Any, end: Any) -> float | None:
    if start is None or end is None:
        return None
    return (end.replace(tzinfo=None) - start.replace(tzinfo=None)).total_seconds()


def execute_job(job_id: str, worker: str = WORKER_ID) -> str | None:
    """Claim and run one job to a terminal status; returns that status, or None if it was not ours to run."""
    settings = get_settings()
    try:
        device, device_error = device_label(get_namespace()), None
    except (GPUUnavailableError, ValueError) as exc:  # GPUEST_DEVICE=gpu without a GPU, or a bad value
        device, device_error = "unavailable", exc
    with session_scope() as session:
        if not job_store.claim(session, job_id, worker=worker, device=device):
            log.info("job not claimed", job_id=job_id)
            return None
        job = session.get(Job, job_id)
        assert job is not None
        kind_name, params, dataset_ids = job.kind, dict(job.params), dict(job.dataset_ids)
        queue_wait = _seconds_between(job.created_at, job.started_at)
    log.info("job started", job_id=job_id, kind=kind_name, worker=worker)

    progress = JobProgress(job_id, worker)
    started = time.perf_counter()
    status, result, error = "failed", None, None
    with Heartbeat(job_id, worker, settings.heartbeat_seconds):
        try:
            if device_error is not None:
                raise device_error
            kind = get_kind(kind_name)
            spec = kind.params_model.model_validate(params)
            data = _load_datasets(dataset_ids)
            result = kind.run(spec, data, progress)
            status = "succeeded"
        except JobCancelled:
            status = "cancelled"
        except (ValueError, ValidationError, KeyError, GPUUnavailableError) as exc:
            error = {"type": type(exc).__name__, "message": str(exc)}
        except MemoryError:
            error = {"type": "OutOfMemory", "message": "the job needed more memory than the worker has"}
        except Exception as exc:
            log.error("job raised", job_id=job_id, traceback=traceback.format_exc())
            error = {"type": type(exc).__name__, "message": str(exc) or "internal error in the kernel"}
    run_seconds = time.perf_counter() - started
    timings = {"queue_wait": queue_wait, "run": run_seconds}
    if result is not None and isinstance(result.get("timings"), dict):
        timings["stages"] = result["timings"]
    with session_scope() as session:
        finished = job_store.finish(
            session,
            job_id,
            worker=worker,
            status=status,
            result=result,
            error=error,
            timings=timings,
            artifacts=progress.artifacts,
        )
    log.info("job finished", job_id=job_id, status=status, recorded=finished, run_seconds=round(run_seconds, 3))
    return status if finished else None


def _load_datasets(dataset_ids: dict[str, str]) -> dict[str, Any]:
    frames: dict[str, Any] = {}
    with session_scope() as session:
        for field, dataset_id in dataset_ids.items():
            dataset = get_dataset(session, dataset_id)
            if dataset is None:
                raise ValueError(f"{field}: dataset {dataset_id} no longer exists")
            frames[field] = load_frame(dataset)
    return frames


def reap_once() -> dict[str, int]:
    """Rescue jobs whose worker stopped heartbeating; re-send lost messages for old queued jobs.

    A queued job older than the stale limit while this worker is idle has lost its message (an idle
    worker would have taken it): sending another is harmless, since only one claim can win.
    """
    settings = get_settings()
    stale_after = timedelta(seconds=settings.stale_after_seconds)
    counts = {"requeued": 0, "failed": 0, "cancelled": 0, "resent": 0}
    with session_scope() as session:
        outcomes = [
            (job.id, job_store.requeue_or_fail_stale(session, job, max_attempts=settings.max_attempts))
            for job in job_store.stale_running_jobs(session, stale_after=stale_after)
        ]
        lost = [] if _busy.is_set() else job_store.queued_job_ids(session, older_than=stale_after)
    for job_id, outcome in outcomes:
        if outcome is None:
            continue
        counts[outcome if outcome != "queued" else "requeued"] += 1
        log.warning("reaped job of a lost worker", job_id=job_id, outcome=outcome)
        if outcome == "queued":
            enqueue_job(job_id)
    for job_id in lost:
        enqueue_job(job_id)
        counts["resent"] += 1
    return counts


def _reaper_loop(interval: float) -> None:
    while True:
        time.sleep(interval)
        try:
            reap_once()
        except Exception:
            log.error("reaper pass failed", traceback=traceback.format_exc())


@worker_ready.connect
def _start_reaper(**_kwargs: Any) -> None:
    interval = get_settings().reaper_interval_seconds
    threading.Thread(target=_reaper_loop, args=(interval,), name="gpuest-reaper", daemon=True).start()
    log.info("worker ready", worker=WORKER_ID, device=device_label(get_namespace()))
