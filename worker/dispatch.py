"""Ring the doorbell: send a job id to a worker queue (the job's own, else the one in the settings)."""

from __future__ import annotations

from kombu import Connection

from store.settings import get_settings
from worker.celery_app import RUN_JOB_TASK, celery_app, transport_options


def _broker_connection() -> Connection:
    # A kombu connection built from the current settings alone: Celery's connection_for_write would merge in
    # the transport options the app was created with (e.g. Redis's visibility_timeout), which the SQLAlchemy
    # transport passes to create_engine and fails on, when the settings changed after import (tests do that).
    settings = get_settings()
    return Connection(settings.resolved_broker_url(), transport_options=transport_options(settings))


def enqueue_job(job_id: str, queue: str | None = None) -> None:
    with _broker_connection() as connection:
        celery_app.send_task(RUN_JOB_TASK, args=[job_id], queue=queue or get_settings().queue, connection=connection)


def broker_reachable(timeout: float = 2.0) -> bool:
    try:
        with _broker_connection() as connection:
            connection.ensure_connection(max_retries=1, timeout=timeout)
        return True
    except Exception:
        return False
