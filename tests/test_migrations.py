"""Alembic is the only way the schema changes: `alembic upgrade head` from empty builds exactly the models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from store.migrate import head_revision
from store.models import Base

REPO_ROOT = Path(__file__).resolve().parents[1]


def _alembic(*args: str, url: str) -> None:
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run([sys.executable, "-m", "alembic", *args], cwd=REPO_ROOT, env=env, check=True, capture_output=True)


def test_alembic_cli_upgrade_from_empty_matches_the_models_and_downgrades(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'schema.sqlite3'}"
    _alembic("upgrade", "head", url=url)
    engine = create_engine(url)
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() == head_revision()
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    assert {"api_keys", "datasets", "jobs"} <= set(inspect(engine).get_table_names())

    _alembic("downgrade", "base", url=url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()


def test_0002_adds_the_job_queue_columns_to_existing_rows_and_downgrades(tmp_path: Path) -> None:
    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'schema.sqlite3'}"
    _alembic("upgrade", "0001", url=url)
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO jobs (id, owner, kind, params, dataset_ids, status, progress, attempts, cancel_requested,"
            " created_at, timings, artifacts) VALUES ('j1', 'o', 'crve_montecarlo', '{}', '{}', 'queued', 0, 0, 0,"
            " '2026-01-01 00:00:00', '{}', '{}')"
        ))
    _alembic("upgrade", "0002", url=url)
    with engine.connect() as connection:
        row = connection.execute(text("SELECT id, queue, enqueued_at FROM jobs")).one()
    assert tuple(row) == ("j1", None, None)  # the reaper reads these as "the one queue" and "sent at creation"
    assert "ix_jobs_status_queue_enqueued" in {index["name"] for index in inspect(engine).get_indexes("jobs")}

    _alembic("downgrade", "0001", url=url)
    engine.dispose()
    engine = create_engine(url)
    assert {"queue", "enqueued_at"}.isdisjoint(column["name"] for column in inspect(engine).get_columns("jobs"))
    with engine.connect() as connection:
        assert connection.execute(text("SELECT id FROM jobs")).scalars().all() == ["j1"]
    engine.dispose()
