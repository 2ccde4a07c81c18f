"""The Celery application: broker from settings, one job at a time per worker, late acks.

The database is the truth and the broker only a doorbell: a message carries nothing but the job id.
"""

from __future__ import annotations

from celery import Celery

from store.settings import get_settings

RUN_JOB_TASK = "gpuest.run_job"


def make_celery() -> Celery:
    settings = get_settings()
    app = Celery("gpuest", broker=settings.resolved_broker_url(), include=["worker.tasks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_default_queue=settings.queue,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_seconds},
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        broker_heartbeat=0,
    )
    return app


celery_app = make_celery()
