"""Engines and sessions for the configured database, and the check that its schema is migrated."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker

from core.settings import get_settings


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the API read while the worker writes; the busy timeout turns lock contention into waiting.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


CONNECT_TIMEOUT_SECONDS = 5

# The classes SQLAlchemy wraps "the database is not there" in: a refused or dropped connection and
# server shutdown (OperationalError), a connection already closed (InterfaceError), a connection lost
# under a statement, and a pool with no free connection (TimeoutError).
_UNAVAILABLE_ERRORS = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError, sa_exc.TimeoutError)


def is_database_unavailable(error: BaseException) -> bool:
    """Whether ``error`` means the database cannot be reached right now (retry later), not a bad query."""
    if isinstance(error, _UNAVAILABLE_ERRORS):
        return True
    return isinstance(error, sa_exc.DBAPIError) and bool(error.connection_invalidated)


def storable_text(value: str) -> bool:
    """Whether a text can be a bind parameter on every supported database: PostgreSQL refuses NUL characters,
    and no driver can encode a lone UTF-16 surrogate (JSON's "\\ud800") as UTF-8."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@cache
def engine_for(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # A bounded connect: an unreachable server (a dropped route, a firewall) must become an error the API
    # can answer 503 to, not a request that hangs for libpq's default of forever.
    return create_engine(
        url, pool_pre_ping=True, pool_size=10, max_overflow=20, pool_timeout=10,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS},
    )


def get_engine() -> Engine:
    return engine_for(get_settings().resolved_database_url())


@cache
def _session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(bind=engine_for(url), expire_on_commit=False)


@contextmanager
def session_scope() -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = _session_factory(get_settings().resolved_database_url())()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
