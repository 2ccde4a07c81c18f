"""Ring the doorbell: send a job id to the worker queue of the current settings."""

from __future__ import annotations

from store.settings import get_settings
from worker.celery_app import RUN_JOB_TASK, celery_app, transport_options


def enqueue_job(job_id: str) -> None:
    settings = get_settings()
    with celery_app.connection_for_write(
        url=settings.resolved_broker_url(), transport_options=transport_options(settings)
    ) as connection:
        celery_app.send_task(RUN_JOB_TASK, args=[job_id], queue=settings.queue, connection=connection)


def broker_reachable(timeout: float = 2.0) -> bool:
    settings = get_settings()
    try:
        with celery_app.connection_for_write(
            url=settings.resolved_broker_url(), transport_options=transport_options(settings)
        ) as connection:
            connection.ensure_connection(max_retries=1, timeout=timeout)
        return True
    except Exception:
        return False
