"""Infrastructure errors inside the worker: a database or broker that is briefly out of reach (a dropped
connection, ``pg_terminate_backend``, a restart or failover, a full pool, a broker reconnect) is retried
with bounded exponential backoff and never fails a job whose kernel is fine.

Each retried call must be a whole unit of work (its own ``session_scope``), so a retry starts from a clean
session on a fresh connection. A call still failing when its time budget is spent raises
:class:`InfrastructureUnavailable`; the worker then leaves the job to the reaper (re-queued once its
heartbeat is stale) rather than failing it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import structlog
from kombu.exceptions import OperationalError as BrokerOperationalError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from store.db import get_engine, is_database_unavailable

log = structlog.get_logger("gpuest.worker")

T = TypeVar("T")

FIRST_DELAY_SECONDS = 0.1
MAX_DELAY_SECONDS = 5.0


def _broker_error_types() -> tuple[type[BaseException], ...]:
    # kombu wraps a failed publish in its OperationalError; redis-py's own errors can escape a raw client.
    types: list[type[BaseException]] = [BrokerOperationalError, ConnectionError]
    try:
        import redis.exceptions
    except ImportError:  # the embedded stack's SQLAlchemy transport needs no redis package
        return tuple(types)
    return (*types, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


BROKER_ERRORS = _broker_error_types()


class InfrastructureUnavailable(Exception):
    """A database or broker call that still failed after its retries. Not a job failure: never a
    ValueError, so a kernel's error handling cannot mistake it for bad input."""


def is_infrastructure_error(error: BaseException) -> bool:
    """The database or broker could not be reached (retry later), as opposed to a bug or bad input."""
    if isinstance(error, InfrastructureUnavailable):
        return True
    return is_database_unavailable(error) or isinstance(error, BROKER_ERRORS)


def describe(error: BaseException) -> str:
    """For the log only: the error's type and first line (SQL and hosts included, never shown to users)."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first_line[:500]}"


def forget_dead_connections(error: BaseException) -> None:
    """After a dropped connection, the pool's other connections are likely dead too (a restart or failover
    kills them all): drop them now, so the retry connects afresh instead of finding them one by one."""
    if not isinstance(error, DBAPIError):
        return
    if error.connection_invalidated or isinstance(error, (OperationalError, InterfaceError)):
        try:
            get_engine().dispose()
        except Exception as exc:  # disposing is best effort; the pool's pre-ping still guards each checkout
            log.warning("could not dispose the connection pool", error=describe(exc))


def retry_infrastructure(
    call: Callable[[], T],
    *,
    what: str,
    budget_seconds: float,
    job_id: str | None = None,
    first_delay: float = FIRST_DELAY_SECONDS,
    max_delay: float = MAX_DELAY_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, retried on infrastructure errors with exponential backoff (jittered, capped at
    ``max_delay``) for up to ``budget_seconds``; any other error propagates at once.

    Raises :class:`InfrastructureUnavailable` (from the last error) once the budget is spent."""
    deadline = time.monotonic() + budget_seconds
    delay = first_delay
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except Exception as exc:
            if not is_infrastructure_error(exc) or isinstance(exc, InfrastructureUnavailable):
                raise
            forget_dead_connections(exc)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.error("database or broker still unavailable; giving up", what=what, job_id=job_id,
                          attempts=attempt, error=describe(exc))
                raise InfrastructureUnavailable(f"{what}: the database or broker is unavailable") from exc
            log.warning("database or broker error; retrying", what=what, job_id=job_id, attempt=attempt,
                        error=describe(exc))
            sleep(min(delay * (0.5 + random.random()), remaining))
            delay = min(2 * delay, max_delay)
