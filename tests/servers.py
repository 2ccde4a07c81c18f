"""Helpers for the Postgres + Redis tier: a throwaway database per test, so tests never share rows."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable


def server_urls() -> tuple[str, str] | None:
    """(DATABASE_URL, REDIS_URL) when both are exported, else None."""
    database_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    if database_url and redis_url and database_url.startswith("postgresql"):
        return database_url, redis_url
    return None


def fresh_postgres_database(admin_url: str) -> tuple[str, Callable[[], None]]:
    """Create a database beside the one ``admin_url`` names; returns its URL and a function dropping it."""
    from sqlalchemy import create_engine, make_url, text

    name = f"gpuest_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(make_url(admin_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(admin_url).set(database=name).render_as_string(hide_password=False), drop
