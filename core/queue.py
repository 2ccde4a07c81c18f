"""The job queue: the Celery application, ``send`` (ring the doorbell) and the broker probe.

The database is the truth and the broker only a doorbell: a message carries nothing but the job id, and the
worker reads everything else from the job row. The API sees only :func:`send` and :func:`broker_reachable`;
the worker (``worker/tasks.py``) registers its task on :func:`get_celery_app` and is started with
``celery -A worker.tasks:celery_app worker ...``.

Nothing happens at import: the application (and the SQLAlchemy transport's polling interval) is set up on
first use, so importing this module costs the API no broker work.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from core.settings import Settings, get_settings
from core.status import JobPriority

if TYPE_CHECKING:
    from celery import Celery
    from kombu import Connection

RUN_JOB_TASK = "gpuest.run_job"
# kombu's SQLAlchemy transport polls its table once a second by default: up to a second of queue latency.
# A shorter interval trades an idle worker's CPU for the queue's latency; bench/RESULTS.md ("API and service")
# records both at 0.1, 0.05 and 0.02 s.
SQLALCHEMY_POLLING_SECONDS = 0.05
# Celery message priority per job priority. Redis (kombu) keeps one list per step of priority_steps and
# takes from the smallest step first: 0 is the highest. (kombu's SQLAlchemy transport ignores priorities:
# the worker orders queued jobs itself, see worker.execute.execute_job.)
MESSAGE_PRIORITY = {JobPriority.HIGH: 0, JobPriority.NORMAL: 3, JobPriority.LOW: 6}
REDIS_PRIORITY_STEPS = [0, 3, 6, 9]


def transport_options(settings: Settings) -> dict[str, Any]:
    url = settings.resolved_broker_url()
    if url.startswith(("redis://", "rediss://")):
        # Redis hands an unacknowledged message to another worker only after this many seconds.
        return {"visibility_timeout": settings.visibility_timeout_seconds, "priority_steps": REDIS_PRIORITY_STEPS,
                "queue_order_strategy": "priority"}
    return {}


def _poll_sqlalchemy_broker_faster() -> None:
    # The transport forwards every transport option to create_engine, so its polling interval can only be
    # set on the class.
    from kombu.transport import sqlalchemy as kombu_sqlalchemy

    kombu_sqlalchemy.Transport.polling_interval = SQLALCHEMY_POLLING_SECONDS


def make_celery(settings: Settings) -> Celery:
    """A Celery application for ``settings``: one job at a time per worker, late acks, JSON messages."""
    from celery import Celery

    # The result backend only counts the parts of fanned-out jobs' chords (worker/fanout.py); every other task
    # ignores its result (the database holds results).
    app = Celery("gpuest", broker=settings.resolved_broker_url(), backend=settings.resolved_result_backend_url())
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


_celery_app: Celery | None = None
# Built once under a lock: the API's first sends come from several threads at once, and concurrent first
# imports of celery's lazily loaded modules can fail ("cannot import name 'Celery'").
_celery_app_lock = threading.Lock()


def get_celery_app() -> Celery:
    """The process's Celery application, built on first use from the settings of that moment."""
    global _celery_app
    if _celery_app is None:
        with _celery_app_lock:
            if _celery_app is None:
                _poll_sqlalchemy_broker_faster()
                _celery_app = make_celery(get_settings())
    return _celery_app


def broker_connection() -> Connection:
    """A kombu connection built from the current settings alone.

    Not Celery's ``connection_for_write``: that merges in the transport options the application was built
    with (e.g. Redis's visibility_timeout, which the SQLAlchemy transport passes to create_engine and fails
    on) when the settings changed since (tests do that)."""
    from kombu import Connection

    settings = get_settings()
    return Connection(settings.resolved_broker_url(), transport_options=transport_options(settings))


def send(job_id: str, queue: str | None = None, priority: JobPriority = JobPriority.NORMAL) -> None:
    """Send a job id to a worker queue: the job's own, else the one in the settings."""
    send_many([job_id], queue, priority)


def send_many(job_ids: list[str], queue: str | None = None, priority: JobPriority = JobPriority.NORMAL) -> None:
    """Send several job ids over one broker connection (a sweep's members), with the Celery priority of
    ``priority``.

    A process's first send runs alone: it is the first use of much that Celery and kombu set up lazily and
    not thread-safely (the configuration, the AMQP helpers, the transport module), and the API's first sends
    come from many threads at once (CI saw 3 of 50 concurrent first submits fail to send with a live broker).
    """
    global _first_send_done
    if _first_send_done:
        _send_over_one_connection(job_ids, queue, priority)
        return
    with _first_send_lock:
        _send_over_one_connection(job_ids, queue, priority)
        _first_send_done = True


_first_send_done = False
_first_send_lock = threading.Lock()


def _send_over_one_connection(job_ids: list[str], queue: str | None, priority: JobPriority) -> None:
    with broker_connection() as connection:
        for job_id in job_ids:
            get_celery_app().send_task(
                RUN_JOB_TASK, args=[job_id], queue=queue or get_settings().queue, connection=connection,
                priority=MESSAGE_PRIORITY[JobPriority(priority)],
                ignore_result=True,  # else a Redis result backend subscribes this process to every job's result
            )


def broker_reachable(timeout: float = 2.0) -> bool:
    try:
        with broker_connection() as connection:
            connection.ensure_connection(max_retries=1, timeout=timeout)
        return True
    except Exception:
        return False
