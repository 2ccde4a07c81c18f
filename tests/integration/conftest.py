"""The real stack for the integration tests: ``gpuest serve``'s processes (uvicorn + a Celery worker) on the
embedded tier (SQLite) and, where DATABASE_URL and REDIS_URL are set, on Postgres + Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.serve import EmbeddedStack, embedded_stack
from tests import servers


def tier_env(tier: str, data_dir: Path) -> tuple[dict[str, str], object]:
    """The stack's environment on ``tier`` and, for a fresh Postgres database, the call that drops it."""
    env = {"GPUEST_DATA_DIR": str(data_dir), "GPUEST_DEVICE": "cpu", "GPUEST_QUEUE": f"test-{uuid.uuid4().hex[:8]}"}
    if tier == "embedded":
        env["DATABASE_URL"] = f"sqlite:///{data_dir / 'gpuest.sqlite3'}"
        env["BROKER_URL"] = f"sqla+sqlite:///{data_dir / 'broker.sqlite3'}"
        return env, None
    urls = servers.server_urls()
    if urls is None:
        pytest.skip("DATABASE_URL and REDIS_URL not set: the Postgres + Redis tier is skipped")
    database_url, drop = servers.fresh_postgres_database(urls[0])
    env.update(DATABASE_URL=database_url, BROKER_URL=urls[1])
    return env, drop


@pytest.fixture(params=["embedded", pytest.param("servers", marks=pytest.mark.servers)])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedStack]:
    env, drop = tier_env(request.param, tmp_path)
    try:
        with embedded_stack(tmp_path, env=env, log_dir=tmp_path / "logs") as running:
            yield running
    finally:
        if callable(drop):
            drop()
