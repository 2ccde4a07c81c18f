"""The API in this process on an embedded store (a migrated SQLite copy, kombu's SQLAlchemy broker on a file),
auth on, for the attacks that need no servers: what a request costs the API is measured here, where
``tracemalloc`` and the clock see it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import core.queue
from core.settings import get_settings
from store import db
from store import jobs as job_store
from store.db import session_scope
from store.keys import create_key


@dataclass
class EmbeddedApi:
    client: TestClient
    headers: dict[str, str]


def _clear_cached_settings() -> None:
    get_settings.cache_clear()
    db.engine_for.cache_clear()
    db._session_factory.cache_clear()


@contextmanager
def embedded_api(directory: Path, migrated_sqlite: Callable[[Path], None], **settings: str) -> Iterator[EmbeddedApi]:
    """A client with an owner's key on a fresh store under ``directory``; ``settings``: GPUEST_* variables."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("DATABASE_URL", "GPUEST_DATABASE_URL", "BROKER_URL", "REDIS_URL"):
            patch.delenv(name, raising=False)
        environment = {
            "GPUEST_DATA_DIR": str(directory / "var"),
            "GPUEST_AUTH_ENABLED": "true",
            "GPUEST_BROKER_URL": f"sqla+sqlite:///{directory / 'broker.sqlite3'}",
            **settings,
        }
        for name, value in environment.items():
            patch.setenv(name, value)
        _clear_cached_settings()
        patch.setattr(core.queue, "_celery_app", None)
        migrated_sqlite(Path(get_settings().resolved_database_url().removeprefix("sqlite:///")))
        from api.app import create_app

        try:
            with TestClient(create_app(), raise_server_exceptions=False) as client:
                with session_scope() as session:
                    key = create_key(session, "attacker")
                yield EmbeddedApi(client, {"Authorization": f"Bearer {key}"})
        finally:
            db.get_engine().dispose()
            _clear_cached_settings()


def finish_with_result(job_id: str, result: dict) -> None:
    """Claim and finish a job with the store calls a worker makes (no worker runs here)."""
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker="test-worker", device="cpu")
    with session_scope() as session:
        assert job_store.finish(
            session, job_id, worker="test-worker", status="succeeded", result=result, timings={"run": 0.01}
        )
