"""Shared test fixtures: the ``gpu`` marker skips without a usable CUDA device; ``xp`` runs a test once per
available array backend (NumPy always, CuPy where a GPU is usable)."""

from __future__ import annotations

import functools
import os
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from kernels.backend import get_namespace, gpu_available
from tests.webhook_receiver import FakeResolver

# Hypothesis keeps its example database and caches in a temporary directory, not in the checkout.
set_hypothesis_home_dir(tempfile.mkdtemp(prefix="gpuest-hypothesis-"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gpu_available():
        return
    skip_gpu = pytest.mark.skip(reason="no CUDA device usable through CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request: pytest.FixtureRequest) -> ModuleType:
    """The array namespace of each backend in turn: a kernel test taking ``xp`` runs on NumPy and, where a
    GPU is usable, on CuPy (the CuPy run carries the ``gpu`` marker, so it skips without one)."""
    return np if request.param == "numpy" else get_namespace("gpu")


# -- a migrated SQLite store per test, copied from one migrated once per session

@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], None]:
    """A function writing a SQLite database at head to a path: the migrations run once per session, each test
    gets a copy (the same schema ``upgrade_to_head`` makes, in milliseconds instead of a migration run)."""
    from store.db import engine_for
    from store.migrate import upgrade_to_head

    template = tmp_path_factory.mktemp("migrated") / "gpuest.sqlite3"
    url = f"sqlite:///{template}"
    upgrade_to_head(url)
    engine_for(url).dispose()

    def copy_to(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        source, target = sqlite3.connect(template), sqlite3.connect(path)
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()

    return copy_to


# -- servers tier: skipped (with the reason) without Postgres + Redis; GPUEST_REQUIRE_SERVERS=1 (set by
#    .ci/run) turns that skip into a failure, so CI cannot pass by silently skipping the tier.

@functools.cache
def _servers_problem() -> str | None:
    """Why the Postgres + Redis tier cannot run here, or None when DATABASE_URL and REDIS_URL answer."""
    from tests.servers import server_urls

    urls = server_urls()
    if urls is None:
        return "DATABASE_URL (postgresql://...) and REDIS_URL (redis://...) are not both set"
    database_url, redis_url = urls
    try:
        import redis
        from sqlalchemy import create_engine, text

        engine = create_engine(database_url, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        finally:
            engine.dispose()
        redis.Redis.from_url(redis_url, socket_connect_timeout=3).ping()
    except Exception as error:  # any driver error means the same thing here: the tier cannot run
        return f"Postgres or Redis not reachable: {type(error).__name__}: {error}"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "servers" not in item.keywords:
        return
    problem = _servers_problem()
    if problem is None:
        return
    if os.environ.get("GPUEST_REQUIRE_SERVERS") == "1":
        pytest.fail(f"servers tier required (GPUEST_REQUIRE_SERVERS=1) but {problem}", pytrace=False)
    pytest.skip(f"servers tier skipped: {problem}")


@pytest.fixture(autouse=True)
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> FakeResolver:
    """Webhook targets' names resolved from a table (tests/webhook_receiver.py), never the network."""
    from store import webhook_targets

    resolver = FakeResolver()
    monkeypatch.setattr(webhook_targets, "lookup", resolver)
    return resolver
