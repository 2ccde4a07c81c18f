"""Ring the doorbell: send a job id to the worker queue."""

from __future__ import annotations

from worker.celery_app import RUN_JOB_TASK, celery_app


def enqueue_job(job_id: str) -> None:
    celery_app.send_task(RUN_JOB_TASK, args=[job_id])


def broker_reachable(timeout: float = 2.0) -> bool:
    try:
        with celery_app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=timeout)
        return True
    except Exception:
        return False
