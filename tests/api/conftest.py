"""An isolated API: a temp data dir with a migrated SQLite database, kombu's SQLAlchemy broker over a
temp SQLite file, the real job registry, and API keys for two owners. No worker runs here, so jobs stay
queued unless a test moves them through the store (the same calls the worker makes).

An API test runs on that embedded store; a test marked ``both_backends`` (the database or the broker matters
to it: claims, constraints, migrations, quotas, retention, queries, deliveries) runs on Postgres + Redis too."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from api_helpers import MAX_UPLOAD_BYTES
from fastapi import FastAPI
from fastapi.testclient import TestClient

import core.queue
from core.settings import get_settings
from store import db
from store.db import session_scope
from store.keys import create_key
from store.migrate import upgrade_to_head
from tests import servers


def clear_cached_settings() -> None:
    get_settings.cache_clear()
    db.engine_for.cache_clear()
    db._session_factory.cache_clear()


EMBEDDED = "embedded"
BOTH_BACKENDS = [EMBEDDED, pytest.param("servers", marks=pytest.mark.servers)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "api_env" in metafunc.fixturenames:
        both = metafunc.definition.get_closest_marker("both_backends") is not None
        metafunc.parametrize("api_env", BOTH_BACKENDS if both else [EMBEDDED], indirect=True)


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """One throwaway Postgres database for the session's servers-tier API tests (emptied before each)."""
    url, drop = servers.fresh_postgres_database(os.environ["DATABASE_URL"])
    yield url
    drop()


def _empty_tables(database_url: str) -> None:
    from sqlalchemy import text

    with db.engine_for(database_url).begin() as connection:
        # CASCADE: tables that reference these (a later migration's) are emptied with them
        connection.execute(
            text("TRUNCATE job_events, webhook_deliveries, jobs, job_groups, datasets, api_keys CASCADE")
        )


@pytest.fixture
def api_env(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    migrated_sqlite: Callable[[Path], None],
) -> Iterator[dict[str, str]]:
    """Environment of a fresh, migrated store with auth on; the test process uses it.

    ``embedded``: SQLite (a copy of the session's migrated one) + kombu's SQLAlchemy broker in tmp_path.
    ``servers``: the session's Postgres database (migrated, emptied) and the Redis at REDIS_URL (the root
    conftest skips this tier without them).
    """
    server_urls = (os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", ""))
    data_dir = tmp_path / "var"
    env = {
        "GPUEST_DATA_DIR": str(data_dir),
        "GPUEST_AUTH_ENABLED": "true",
        "GPUEST_BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}",
        "GPUEST_MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES),
        "GPUEST_QUEUE": f"api-test-{uuid.uuid4().hex[:8]}",
    }
    if request.param == "servers":
        env.update(GPUEST_DATABASE_URL=request.getfixturevalue("postgres_database"), GPUEST_BROKER_URL=server_urls[1])
    for name in ("DATABASE_URL", "GPUEST_DATABASE_URL", "BROKER_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    clear_cached_settings()
    # The Celery app is built once per process from the settings of that moment: this test's broker and
    # result backend, not an earlier test's (whose data directory may be gone).
    monkeypatch.setattr(core.queue, "_celery_app", None)
    if request.param == "servers":
        upgrade_to_head()
        _empty_tables(env["GPUEST_DATABASE_URL"])
    else:
        migrated_sqlite(Path(get_settings().resolved_database_url().removeprefix("sqlite:///")))
    yield env
    db.get_engine().dispose()
    clear_cached_settings()
    if request.param == "servers":
        import redis

        redis.Redis.from_url(server_urls[1]).delete(env["GPUEST_QUEUE"])


@pytest.fixture
def app(api_env: dict[str, str]) -> FastAPI:
    from api.app import create_app

    return create_app()


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    """A client (lifespan run) that sends alice's API key unless a request overrides the header."""
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def make_key(api_env: dict[str, str]) -> Callable[[str], str]:
    def make(owner: str) -> str:
        with session_scope() as session:
            return create_key(session, owner)

    return make


@pytest.fixture
def alice(make_key: Callable[[str], str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_key('alice')}"}


@pytest.fixture
def bob(make_key: Callable[[str], str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_key('bob')}"}
