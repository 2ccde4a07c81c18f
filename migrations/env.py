"""Alembic environment: the URL is the configured one unless the caller set sqlalchemy.url."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from core.settings import get_settings
from store.db import engine_for
from store.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url()


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_for(url) if url.startswith("sqlite") else None
    if connectable is None:
        from sqlalchemy import create_engine

        connectable = create_engine(url, poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
