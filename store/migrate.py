"""Alembic, driven from code: upgrade to head, and refuse to serve on an un-migrated database."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from core.settings import get_settings
from store.db import engine_for

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class SchemaNotMigratedError(RuntimeError):
    """The database is not at the newest Alembic revision."""


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url or get_settings().resolved_database_url())
    return config


def upgrade_to_head(url: str | None = None) -> None:
    resolved = url or get_settings().resolved_database_url()
    if resolved.startswith("sqlite:///"):
        Path(resolved.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(resolved), "head")


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _missing_sqlite_file(url: str) -> bool:
    # Connecting would create an empty file, leaving a database that looks present but has no schema.
    if not url.startswith("sqlite:///") or url.startswith("sqlite:///:memory:"):
        return False
    return not Path(url.removeprefix("sqlite:///").split("?", 1)[0]).exists()


def ensure_migrated(url: str | None = None) -> None:
    """Raise :class:`SchemaNotMigratedError` with the command to run unless the schema is at head.

    Reads only: a missing SQLite file stays missing.
    """
    resolved = url or get_settings().resolved_database_url()
    current = None if _missing_sqlite_file(resolved) else current_revision(engine_for(resolved))
    head = head_revision()
    if current != head:
        found = "the database has no gpuest schema" if current is None else f"the schema is at revision {current!r}"
        raise SchemaNotMigratedError(
            f"{found}, the code needs revision {head!r}: run `gpuest db upgrade` (or `alembic upgrade head`) first"
        )
