"""The Celery application: broker from settings, one job at a time per worker, late acks.

The database is the truth and the broker only a doorbell: a message carries nothing but the job id.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from store.settings import Settings, get_settings

RUN_JOB_TASK = "gpuest.run_job"


def transport_options(settings: Settings) -> dict[str, Any]:
    url = settings.resolved_broker_url()
    if url.startswith(("redis://", "rediss://")):
        # Redis hands an unacknowledged message to another worker only after this many seconds.
        return {"visibility_timeout": settings.visibility_timeout_seconds}
    return {}


def _poll_sqlalchemy_broker_faster() -> None:
    # kombu's SQLAlchemy transport forwards every transport option to create_engine, so its polling
    # interval (1 s by default: up to a second of queue latency per job) can only be set on the class.
    from kombu.transport import sqlalchemy as kombu_sqlalchemy

    kombu_sqlalchemy.Transport.polling_interval = 0.1


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
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
        broker_transport_options=transport_options(settings),
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app


_poll_sqlalchemy_broker_faster()
celery_app = make_celery()
